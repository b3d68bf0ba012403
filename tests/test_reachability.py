"""How fast "Server reachable" follows the server, and what callers see while it is down.

A request that cannot connect marks the server down at once; one cut short (the server killed
mid-stream) has it polled at once; while it is down it is polled every ``DOWN_POLL_INTERVAL``, so
it shows as reachable within seconds of its return. Jobs do not start while it is down, and a
caller waiting for a job is answered at once, with the job queued and why.

The last test kills a real ``llama-server`` mid-stream: the kill and the failure are real; the
poll that finds it down comes at once, with Home Assistant's time standing still, and the polls
after the restart run on Home Assistant's fake time.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
import logging

from homeassistant.const import STATE_OFF, STATE_ON
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.util import dt as dt_util
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
)

from custom_components.llm_lanes.const import SERVER_POLL_INTERVAL
from custom_components.llm_lanes.coordinator import DOWN_POLL_INTERVAL
from custom_components.llm_lanes.core.errors import StreamClosedError
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.jobs.model import JobStatus
from tests.support.llamacpp import MODEL_ALIAS, LlamaServer
from tests.support.llamacpp_slots import kill_mid_answers
from tools.simulator.server import SimulatedServer

from .support.entities import state_of
from .support.entries import async_set_up, server_entry
from .support.requests import async_call_action, async_generate, async_wait_for

BACK_WITHIN = timedelta(seconds=5)


def _reachable(hass: HomeAssistant, entry: MockConfigEntry) -> str:
    return state_of(hass, entry, "binary_sensor", "server_reachable")


async def _move_on(hass: HomeAssistant, by: timedelta) -> None:
    """Move Home Assistant's time on; the polls due by then run."""
    async_fire_time_changed(hass, dt_util.utcnow() + by)
    await hass.async_block_till_done(wait_background_tasks=True)


async def test_a_request_that_cannot_connect_marks_the_server_down_at_once(
    hass: HomeAssistant, sim: SimulatedServer, init_integration: MockConfigEntry
) -> None:
    """Off as the request fails (no poll needed), polled every few seconds, on once it is back."""
    entry = init_integration
    server = entry.runtime_data.server
    port = sim.port
    await sim.stop()
    assert _reachable(hass, entry) == STATE_ON  # no poll has run since

    with pytest.raises(HomeAssistantError) as err:
        await async_call_action(
            hass, "generate", config_entry_id=entry.entry_id, prompt="Lights?"
        )
    assert err.value.translation_key == "cannot_connect"
    assert _reachable(hass, entry) == STATE_OFF
    assert server.unreachable_since is not None
    assert server.update_interval == DOWN_POLL_INTERVAL

    await _move_on(hass, DOWN_POLL_INTERVAL)  # still down: polled again, still off
    assert _reachable(hass, entry) == STATE_OFF

    async with SimulatedServer(replace(sim.config, port=port)):
        await _move_on(hass, DOWN_POLL_INTERVAL)
        assert _reachable(hass, entry) == STATE_ON
        assert server.update_interval == SERVER_POLL_INTERVAL
        assert server.unreachable_since is None
        assert await hass.config_entries.async_unload(entry.entry_id)


async def test_a_request_that_succeeds_while_the_server_shows_down_polls_it(
    hass: HomeAssistant, sim: SimulatedServer, init_integration: MockConfigEntry
) -> None:
    """A request that gets an answer while the server shows as down has it polled at once."""
    entry = init_integration
    port = sim.port
    await sim.stop()
    await entry.runtime_data.server.async_refresh()
    assert _reachable(hass, entry) == STATE_OFF
    async with SimulatedServer(replace(sim.config, port=port)):
        await async_generate(entry, requester="automation:automation.x")
        await hass.async_block_till_done(wait_background_tasks=True)
        assert _reachable(hass, entry) == STATE_ON
        assert await hass.config_entries.async_unload(entry.entry_id)


async def test_summarize_and_wait_answers_at_once_while_the_server_is_down(
    hass: HomeAssistant, sim: SimulatedServer, init_integration: MockConfigEntry
) -> None:
    """Unknown down: the first attempt fails, and the caller gets the job queued with the error.

    Known down: the job is not even started; the caller gets it queued, server unreachable. Once
    the server is back (and polled), the job runs.
    """
    entry = init_integration
    manager = entry.runtime_data.jobs
    port = sim.port
    await sim.stop()

    first = await async_call_action(
        hass, "summarize", text="The door opened.", run_now=True, wait=True
    )
    assert first["status"] == "queued"
    assert first["wait_reason"] == "retry_backoff"
    assert "BackendConnectionError" in first["error"]
    assert _reachable(hass, entry) == STATE_OFF

    second = await async_call_action(
        hass, "summarize", text="The window opened.", run_now=True, wait=True
    )
    assert second["status"] == "queued"
    assert second["wait_reason"] == "server_unreachable"
    assert manager.get(second["job_id"]).attempts == 0

    async with SimulatedServer(replace(sim.config, port=port)):
        await _move_on(hass, DOWN_POLL_INTERVAL)
        assert _reachable(hass, entry) == STATE_ON
        job = await manager.async_wait(second["job_id"], 60)
        assert job.status is JobStatus.DONE
        assert await hass.config_entries.async_unload(entry.entry_id)


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[tuple[str, str]]:
    """Return what the integration logged at ``level`` or above."""
    return [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if record.name.startswith("custom_components.llm_lanes")
        and record.levelno >= level
    ]


def _down_at_debug(caplog: pytest.LogCaptureFixture) -> int:
    """Count the DEBUG lines that say the server does not answer."""
    return sum(
        level == "DEBUG" and "does not answer" in message
        for level, message in _said(caplog, logging.DEBUG)
    )


async def test_a_server_down_for_many_polls_is_logged_once(
    hass: HomeAssistant,
    sim: SimulatedServer,
    init_integration: MockConfigEntry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Down for many polls: one WARNING, then DEBUG, never an ERROR; back: one INFO.

    The reachable sensor and the repair say the server is down meanwhile: the log says it once.
    """
    entry = init_integration
    port = sim.port
    caplog.set_level(logging.DEBUG, logger="custom_components.llm_lanes")
    await sim.stop()
    caplog.clear()
    await _move_on(hass, SERVER_POLL_INTERVAL)
    for _ in range(8):
        await _move_on(hass, DOWN_POLL_INTERVAL)
    assert _reachable(hass, entry) == STATE_OFF

    said = [(level, "does not answer" in m) for level, m in _said(caplog, logging.INFO)]
    assert said == [("WARNING", True)]
    assert _down_at_debug(caplog) >= 8  # every poll after the first said it, at DEBUG

    caplog.clear()
    async with SimulatedServer(replace(sim.config, port=port)):
        for _ in range(3):
            await _move_on(hass, DOWN_POLL_INTERVAL)
        assert _reachable(hass, entry) == STATE_ON
        said = [(level, "recovered" in m) for level, m in _said(caplog, logging.INFO)]
        assert said == [("INFO", True)]
        assert await hass.config_entries.async_unload(entry.entry_id)


async def test_a_server_the_pool_put_to_sleep_is_no_outage_in_the_log(
    hass: HomeAssistant,
    sim: SimulatedServer,
    init_integration: MockConfigEntry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Silent because the pool has it asleep: the polls say so at DEBUG only."""
    entry = init_integration
    entry.runtime_data.sleeps = lambda: (
        True
    )  # what the household says of a server asleep
    caplog.set_level(logging.DEBUG, logger="custom_components.llm_lanes")
    await sim.stop()
    caplog.clear()
    await _move_on(hass, SERVER_POLL_INTERVAL)
    await _move_on(hass, DOWN_POLL_INTERVAL)
    assert _reachable(hass, entry) == STATE_OFF
    assert _said(caplog, logging.WARNING) == []
    assert _down_at_debug(caplog) >= 1
    assert await hass.config_entries.async_unload(entry.entry_id)


@pytest.mark.llamacpp
async def test_killing_the_real_server_mid_stream(
    ha_core: HomeAssistant, socket_enabled: None
) -> None:
    """Kill llama-server mid-stream: "Server reachable" is off at once, on within 5 s after.

    The server's slots hold 1,024 tokens, so the lanes stop there and a longer prompt is refused
    up front.
    """
    hass = ha_core
    server = LlamaServer(parallel=2)
    await server.__aenter__()
    try:
        entry = await async_set_up(
            hass, server_entry(server.url, "llama_cpp", model=MODEL_ALIAS)
        )
        runtime = entry.runtime_data
        assert runtime.server.context_per_slot == server.context_per_slot
        assert (
            runtime.scheduler.settings.lanes[Lane.VOICE].max_prompt_tokens
            == server.context_per_slot
        )
        with pytest.raises(ServiceValidationError) as err:
            await async_call_action(
                hass,
                "generate",
                config_entry_id=entry.entry_id,
                prompt="word " * 1500,
            )
        assert err.value.translation_key == "context_exceeded"

        story = server.context_per_slot - 64  # the whole slot, end-of-stream ignored
        stream = runtime.scheduler.stream(
            ChatRequest(
                model=MODEL_ALIAS,
                messages=(ChatMessage(role="user", content="Tell a long story."),),
                max_tokens=story,
                temperature=0.0,
                options={"ignore_eos": True},
            ),
            lane=Lane.AUTOMATION,
            requester="automation:automation.story",
        )
        first = asyncio.create_task(anext(stream))
        # Killed mid-answer at the server (tokens written, tokens to go), from a worker thread:
        # the client is no clock for it (a loaded event loop relays the tokens seconds late).
        await asyncio.to_thread(kill_mid_answers, server, {story})
        assert (await first) is not None
        with pytest.raises(StreamClosedError):
            async for _ in stream:
                pass
        # The stream cut short has the server polled at once: off with Home Assistant's time
        # standing still (its next regular poll is SERVER_POLL_INTERVAL away).
        await async_wait_for(lambda: runtime.server.unreachable_since is not None)
        await hass.async_block_till_done(wait_background_tasks=True)
        assert _reachable(hass, entry) == STATE_OFF

        server = LlamaServer(parallel=2, port=server.port)
        await server.__aenter__()
        await _move_on(hass, BACK_WITHIN)
        assert _reachable(hass, entry) == STATE_ON
        assert DOWN_POLL_INTERVAL <= BACK_WITHIN
        assert await hass.config_entries.async_unload(entry.entry_id)
    finally:
        await server.__aexit__(None, None, None)
