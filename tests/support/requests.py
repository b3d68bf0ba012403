"""For the tests of a loaded entry: real requests through its scheduler, and what they left.

The entry and the simulated server come from ``conftest.py`` (``sim_config``, ``sim``,
``init_integration``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.snapshot import FinishedRequest, GenerateResult

from .entries import MODEL


def chat(text: str = "What time is it?", max_tokens: int = 8) -> ChatRequest:
    """Build a one-message chat request for the simulated model."""
    return ChatRequest(
        model=MODEL,
        messages=(ChatMessage(role="user", content=text),),
        max_tokens=max_tokens,
    )


async def async_generate(
    entry: MockConfigEntry,
    *,
    lane: Lane = Lane.AUTOMATION,
    requester: str = "job:test",
    text: str = "What time is it?",
    max_tokens: int = 8,
) -> GenerateResult:
    """Send one real request through the entry's scheduler to the simulated server."""
    result: GenerateResult = await entry.runtime_data.scheduler.generate(
        chat(text, max_tokens), lane=lane, requester=requester
    )
    return result


async def async_call_action(
    hass: HomeAssistant, action: str, context: Context | None = None, **data: Any
) -> dict[str, Any]:
    """Call one of the integration's actions (``llm_lanes.<action>``); return its response."""
    response = await hass.services.async_call(
        DOMAIN, action, data, blocking=True, return_response=True, context=context
    )
    assert isinstance(response, dict)
    return dict(response)


async def async_say(
    hass: HomeAssistant, agent_id: str, text: str, device_id: str = "kitchen-satellite"
) -> conversation.ConversationResult:
    """Say ``text`` to an Assist agent through the voice satellite ``device_id`` (voice lane)."""
    return await conversation.async_converse(
        hass, text, None, Context(), agent_id=agent_id, device_id=device_id
    )


def finished_requests(entry: MockConfigEntry) -> list[FinishedRequest]:
    """Collect every request the entry's scheduler finishes from now on."""
    finished: list[FinishedRequest] = []
    entry.async_on_unload(entry.runtime_data.scheduler.add_listener(finished.append))
    return finished


async def async_wait_for(condition: Callable[[], bool], limit: int = 2000) -> None:
    """Yield to the event loop until ``condition`` holds (bounded, no wall-clock assertion)."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


async def async_look_until(
    look: Callable[[], Awaitable[bool]], limit: int = 400, pause_s: float = 0.05
) -> None:
    """Look (e.g. at a real server's ``/slots``) until ``look`` says yes (bounded: a hang guard).

    The bound counts looks, not seconds: on a loaded machine it stretches with the looks.
    """
    for _ in range(limit):
        if await look():
            return
        await asyncio.sleep(pause_s)
    raise AssertionError(f"not so after {limit} looks")
