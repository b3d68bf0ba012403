"""The sensors a real llama.cpp ``llama-server`` started with ``--metrics --slots`` feeds.

``--slots`` feeds *Slots busy* (the slots processing a request, as the server counts them).
``--metrics`` would feed *KV cache usage*, but llama.cpp's current builds (the tests' b11434)
export no KV-cache gauge any more: the sensor is not made, and this test says so when a build
brings the gauge back.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
import pytest

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from tests.support.entities import state_of
from tests.support.entries import async_set_up, server_entry
from tests.support.llamacpp import LlamaServer
from tests.support.llamacpp_slots import HELD_ANSWER_TOKENS, holding_server
from tests.support.requests import async_wait_for

pytestmark = pytest.mark.llamacpp


@pytest.mark.usefixtures("ha_core", "socket_enabled")
async def test_slots_busy_from_a_real_llama_server(hass: HomeAssistant) -> None:
    """Slots busy is 0 while idle, counts a streaming request, and frees; no KV-cache sensor.

    The request holds its slot until it is cancelled (its own server goes on past a full slot):
    an answer of the shared server's slot is written in about a second, and on a loaded machine
    ended unseen, its tokens relayed late by the event loop in one go.
    """
    async with holding_server() as server:
        await _slots_busy_follows_the_server(hass, server)


async def _slots_busy_follows_the_server(
    hass: HomeAssistant, server: LlamaServer
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/metrics") as response,
    ):
        metrics = await response.text()
    assert response.status == 200
    assert "kv_cache" not in metrics, "this llama.cpp exports a KV-cache gauge again"

    entry = await async_set_up(
        hass,
        server_entry(server.url, "llama_cpp", model=server.model_name, title="real"),
    )
    registry = er.async_get(hass)
    assert (
        registry.async_get_entity_id(
            "sensor", DOMAIN, f"{entry.entry_id}_kv_cache_usage"
        )
        is None
    )
    assert state_of(hass, entry, "sensor", "slots_busy") == "0"

    runtime = entry.runtime_data
    runtime.scheduler.update_settings(  # the lane's own limit is 4,096 output tokens
        runtime.scheduler.settings.with_lane(
            Lane.BACKGROUND, max_output_tokens=HELD_ANSWER_TOKENS
        )
    )
    seen: list[str] = []
    watching = True

    async def watch() -> None:
        # Polled as the coordinator polls, back to back from before the request.
        while watching:
            await runtime.server.async_refresh()
            await hass.async_block_till_done()
            seen.append(state_of(hass, entry, "sensor", "slots_busy"))

    watcher = asyncio.create_task(watch())
    await async_wait_for(lambda: seen != [])
    # An answer that holds the slot until it is cancelled, once seen.
    answer = asyncio.create_task(
        runtime.scheduler.generate(
            ChatRequest(
                model=server.model_name,
                messages=(ChatMessage(role="user", content="Tell a long story."),),
                max_tokens=HELD_ANSWER_TOKENS,
                options={"ignore_eos": True},
            ),
            lane=Lane.BACKGROUND,
            requester="job:test",
        )
    )
    await async_wait_for(lambda: answer.done() or "1" in seen, limit=20_000)
    watching = False
    await watcher
    assert seen[0] == "0"
    if answer.done():  # what ended it, if not a look that saw it (an error, say)
        raise AssertionError(
            f"the answer ended before a look saw it: {answer.result()}"
        )
    assert "1" in seen
    # Cancelled: its stream closed, the server frees the slot at its next token.
    answer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await answer
    for _ in range(1000):  # a hang guard, not a time limit: each look is a full poll
        await runtime.server.async_refresh()
        await hass.async_block_till_done()
        if state_of(hass, entry, "sensor", "slots_busy") == "0":
            break
    else:
        raise AssertionError("slots busy never went back to 0")
    assert await hass.config_entries.async_unload(entry.entry_id)
    assert entry.state is ConfigEntryState.NOT_LOADED
