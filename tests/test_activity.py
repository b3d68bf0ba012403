"""Throttled scheduler snapshots and the request-finished event, with real requests."""

from __future__ import annotations

import asyncio
import logging
import time

from homeassistant.core import HomeAssistant, callback
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_capture_events,
)

from custom_components.llm_lanes.const import EVENT_REQUEST_FINISHED
from custom_components.llm_lanes.coordinator import (
    IDLE_REFRESH_INTERVAL,
    REFRESH_COOLDOWN_S,
)
from custom_components.llm_lanes.core.lanes import Lane
from tools.simulator.server import SimConfig

from .support.entities import async_flush_snapshots, state_of
from .support.requests import async_generate, async_wait_for, chat


@pytest.fixture
def sim_config() -> SimConfig:
    """Run a fast simulated llama.cpp server with eight slots."""
    return SimConfig(slots=8, speed=50)


SECRET_PROMPT = "the door code is 4711"


async def test_request_finished_event(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Each finished request fires one event with its figures and no prompt text."""
    entry = init_integration
    events = async_capture_events(hass, EVENT_REQUEST_FINISHED)

    result = await async_generate(
        entry, lane=Lane.VOICE, requester="user:abc", text=SECRET_PROMPT
    )
    await hass.async_block_till_done()

    assert len(events) == 1
    data = events[0].data
    finished = result.finished
    assert data["config_entry_id"] == entry.entry_id
    assert data["request_id"] == finished.request_id
    assert data["lane"] == "voice"
    assert data["requester"] == "user:abc"
    assert data["outcome"] == "ok"
    assert data["error"] is None
    assert data["ttft_s"] == finished.ttft_s
    assert data["ttft_s"] is not None and data["ttft_s"] > 0
    assert data["itl_p95_s"] == finished.itl_p95_s
    assert data["e2e_s"] == finished.e2e_s
    assert data["prompt_tokens"] == result.usage.prompt_tokens > 0
    assert data["output_tokens"] == result.usage.output_tokens > 0
    assert data["met_ttft"] is finished.met_ttft
    assert data["met_itl"] is finished.met_itl
    assert data["met_objectives"] is finished.met_objectives
    assert data["preemptions"] == 0
    # Sent to this server itself: it ended there, and no pool moved it.
    assert data["server"] == entry.entry_id
    assert (data["pool"], data["failovers"], data["resumed_on"]) == (False, 0, None)
    assert SECRET_PROMPT not in repr(data)
    assert result.text not in repr(data)


async def test_event_for_a_rejected_request(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A request refused at admission still fires the event, with its outcome and error."""
    entry = init_integration
    events = async_capture_events(hass, EVENT_REQUEST_FINISHED)
    scheduler = entry.runtime_data.scheduler
    too_many = scheduler.settings.lanes[Lane.VOICE].max_output_tokens + 1

    with pytest.raises(Exception) as err:  # noqa: PT011 - the scheduler's typed error
        await scheduler.generate(
            chat(max_tokens=too_many), lane=Lane.VOICE, requester="user:abc"
        )
    await hass.async_block_till_done()

    assert len(events) == 1
    assert events[0].data["outcome"] == "rejected"
    assert events[0].data["error"] == type(err.value).__name__
    assert events[0].data["met_objectives"] is False


async def test_snapshots_are_throttled(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A burst of finished requests refreshes the entities at most once a second.

    The last refresh, at the end of the cooldown, carries every request of the burst.
    """
    entry = init_integration
    activity = entry.runtime_data.activity
    refreshes: list[float] = []

    @callback
    def count() -> None:
        refreshes.append(time.monotonic())

    entry.async_on_unload(activity.async_add_listener(count))
    events = async_capture_events(hass, EVENT_REQUEST_FINISHED)

    started = time.monotonic()
    results = await asyncio.gather(
        *(
            async_generate(entry, requester="job:burst", text=f"Question {index}")
            for index in range(6)
        )
    )
    await hass.async_block_till_done()
    elapsed = time.monotonic() - started

    assert len(events) == 6
    # Real requests take real time: allow one refresh per started second of the burst.
    assert 1 <= len(refreshes) <= 1 + int(elapsed / REFRESH_COOLDOWN_S) + 1
    assert len(refreshes) < len(events) or elapsed >= 5 * REFRESH_COOLDOWN_S

    await async_flush_snapshots(hass)

    snapshot = activity.data
    assert snapshot.lanes[Lane.AUTOMATION].finished_total == 6
    tokens = sum(r.usage.prompt_tokens + r.usage.output_tokens for r in results)
    assert state_of(hass, entry, "sensor", "requester_tokens_job:burst") == str(tokens)
    # Nothing left to report: further time brings no refresh until the idle timer.
    before = len(refreshes)
    await async_flush_snapshots(hass)
    assert len(refreshes) == before


async def test_refreshes_while_a_request_runs(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Queue depth and in-flight sensors move during a long generation, not per token."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    activity = entry.runtime_data.activity
    refreshes: list[int] = []
    entry.async_on_unload(
        activity.async_add_listener(lambda: refreshes.append(activity.data.in_flight))
    )
    assert state_of(hass, entry, "sensor", "in_flight") == "0"

    stream = scheduler.stream(
        chat(max_tokens=2000), lane=Lane.INTERACTIVE, requester="user:abc"
    )
    tokens = 0
    async for chunk in stream:
        tokens += chunk.output_tokens
        if tokens >= 10:
            break
    assert scheduler.snapshot().in_flight == 1

    # The idle timer picks the running request up; from then on the busy timer keeps going.
    await async_flush_snapshots(hass, seconds=11)
    assert state_of(hass, entry, "sensor", "in_flight") == "1"
    assert refreshes[-1] == 1
    pushed = len(refreshes)
    # More tokens read: the next snapshot says something new (one that says what the last one
    # said is not pushed, and whether a wall-clock rate moved between two is chance). No request
    # finishes, so only the busy timer, due within 2 s, can push it.
    async for chunk in stream:
        tokens += chunk.output_tokens
        if tokens >= 20:
            break
    await async_flush_snapshots(hass, seconds=2.5)
    assert refreshes[pushed:] == [1]

    async for chunk in stream:
        tokens += chunk.output_tokens
        if tokens >= 60:
            break
    await stream.aclose()
    await async_wait_for(lambda: scheduler.snapshot().in_flight == 0)
    await async_flush_snapshots(hass, seconds=2.5)
    assert state_of(hass, entry, "sensor", "in_flight") == "0"
    # Tens of tokens streamed, a handful of refreshes: snapshots are never taken per token.
    assert len(refreshes) < tokens / 5


async def test_unload_stops_refreshing(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """After unload, finished requests neither fire events nor refresh snapshots."""
    entry = init_integration
    activity = entry.runtime_data.activity
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    events = async_capture_events(hass, EVENT_REQUEST_FINISHED)
    last = activity.data

    await async_flush_snapshots(hass, seconds=30)

    assert events == []
    assert activity.data is last
    assert activity._unsub_timer is None  # noqa: SLF001 - the timer must be gone


async def test_an_idle_server_writes_nothing(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The idle timer's snapshots say nothing new: no state is written, no debug line logged.

    ``scripts/develop`` logs the integration at DEBUG; it used to print a line every 10 s.
    """
    activity = init_integration.runtime_data.activity
    before = activity.data
    caplog.set_level(logging.DEBUG, logger="custom_components.llm_lanes")
    for _ in range(3):
        await async_flush_snapshots(hass, seconds=IDLE_REFRESH_INTERVAL.total_seconds())
    assert activity.data is before
    assert "Manually updated" not in caplog.text

    await async_generate(init_integration)
    await async_flush_snapshots(hass)
    assert activity.data is not before
    assert activity.data.finished_total == before.finished_total + 1
