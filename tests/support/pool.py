"""For the tests of the household's pool: two server entries, their ranks, a pool agent.

The household of the tests: a *GPU box* (the preferred server of every lane, background on it
only) and a *Mini PC* (second choice for voice, typed chats and automations, never background).
Each entry has an agent and an AI Task entity set to the pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from homeassistant.core import HomeAssistant, ServiceCall
from homeassistant.helpers import intent
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    CONF_MODEL,
    CONF_POOL,
    OPT_POOL,
    OPT_WAKE_ENTITY,
    POOL_RANK,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.core.lanes import Lane

from .entries import MODEL, async_set_up, server_entry
from .requests import async_call_action, async_say

GPU_RANKS: Mapping[Lane, int] = {
    Lane.VOICE: 1,
    Lane.INTERACTIVE: 1,
    Lane.AUTOMATION: 1,
    Lane.BACKGROUND: 1,
}
MINI_RANKS: Mapping[Lane, int] = {
    Lane.VOICE: 2,
    Lane.INTERACTIVE: 2,
    Lane.AUTOMATION: 2,
    Lane.BACKGROUND: 0,
}
WAKE_BUTTON = "button.wake_gpu"
"""The template button *Wake GPU* of ``async_set_up_wake_button``."""


def pool_section(ranks: Mapping[Lane, int], **power: Any) -> dict[str, Any]:
    """Return the options' *Several servers* section: the ranks, then wake/sleep settings."""
    return {
        **{POOL_RANK.format(lane=lane.key): rank for lane, rank in ranks.items()},
        **power,
    }


def pool_member_entry(
    url: str,
    title: str,
    ranks: Mapping[Lane, int],
    *,
    kind: str = "llama_cpp",
    model: str,
    agent: str,
    **power: Any,
) -> MockConfigEntry:
    """Build a server entry with its place in the pool, an agent and an AI Task of the pool."""
    key = agent.lower().replace(" ", "_")
    return server_entry(
        url,
        kind,
        model=model,
        title=title,
        options={OPT_POOL: pool_section(ranks, **power)},
        subentries_data=[
            {
                "subentry_type": SUBENTRY_CONVERSATION,
                "data": {CONF_MODEL: model, CONF_POOL: True},
                "subentry_id": f"{key}_agent",
                "title": agent,
                "unique_id": None,
            },
            {
                "subentry_type": SUBENTRY_AI_TASK,
                "data": {CONF_MODEL: model, CONF_POOL: True},
                "subentry_id": f"{key}_task",
                "title": f"{agent} task",
                "unique_id": None,
            },
        ],
    )


async def async_set_up_mini(hass: HomeAssistant, url: str) -> MockConfigEntry:
    """Set up the *Mini PC* at ``url`` (``MINI_RANKS``, ``MODEL``) with its *Mini agent*."""
    return await async_set_up(
        hass,
        pool_member_entry(url, "Mini PC", MINI_RANKS, model=MODEL, agent="Mini agent"),
    )


async def async_set_up_sleeping_gpu(
    hass: HomeAssistant, url: str, ranks: Mapping[Lane, int], *, model: str
) -> MockConfigEntry:
    """Set up the *GPU box* at ``url``, where nothing answers yet, woken by ``WAKE_BUTTON``."""
    return await async_set_up(
        hass,
        pool_member_entry(
            url,
            "GPU box",
            ranks,
            model=model,
            agent="GPU agent",
            **{OPT_WAKE_ENTITY: WAKE_BUTTON},
        ),
    )


def start_job(
    hass: HomeAssistant, entry: MockConfigEntry, text: str, **fields: Any
) -> asyncio.Task[dict[str, Any]]:
    """Start a summary of ``text`` due now on ``entry``'s server; the task ends with its response."""
    return asyncio.create_task(
        async_call_action(
            hass,
            "summarize",
            config_entry_id=entry.entry_id,
            text=text,
            run_now=True,
            wait=True,
            **fields,
        )
    )


async def async_set_up_wake_button(
    hass: HomeAssistant, boot: Callable[[ServiceCall], Awaitable[None]]
) -> None:
    """Set up a template button, *Wake GPU* (``WAKE_BUTTON``), whose press calls ``boot``.

    It stands for a Wake-on-LAN button: ``boot`` starts the sleeping server.
    """
    hass.services.async_register("test", "boot_gpu", boot)
    assert await async_setup_component(
        hass,
        "template",
        {
            "template": [
                {
                    "button": [
                        {"name": "Wake GPU", "press": [{"action": "test.boot_gpu"}]}
                    ]
                }
            ]
        },
    )
    await hass.async_block_till_done()


async def async_voice_command(
    hass: HomeAssistant, agent_id: str, text: str = "turn on the kitchen light"
) -> str:
    """Ask an agent as a voice satellite does (the voice lane); return what it said."""
    result = await async_say(hass, agent_id, text)
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE, (
        result.response.speech
    )
    speech: str = result.response.speech["plain"]["speech"]
    return speech
