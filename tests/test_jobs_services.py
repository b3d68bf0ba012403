"""The job actions, end to end: a loaded entry against the simulated server."""

from __future__ import annotations

from typing import Any

from freezegun.api import FrozenDateTimeFactory
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_capture_events,
)

from custom_components.llm_lanes.const import DOMAIN, EVENT_SUMMARY_READY
from custom_components.llm_lanes.core.backends.base import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.bench.simulator import SimulatedServer
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.jobs.model import JobStatus

from .support.requests import async_summarize

CONTEXT_LIMIT = 300


@pytest.fixture
async def entry(init_integration: MockConfigEntry) -> MockConfigEntry:
    """Load the simulated server's entry, with a small background context limit."""
    scheduler = init_integration.runtime_data.scheduler
    scheduler.update_settings(
        scheduler.settings.with_lane(Lane.BACKGROUND, max_prompt_tokens=CONTEXT_LIMIT)
    )
    return init_integration


@pytest.fixture
def scheduler(entry: MockConfigEntry) -> Scheduler:
    """Return the loaded entry's scheduler."""
    return entry.runtime_data.scheduler


@pytest.fixture
def manager(entry: MockConfigEntry) -> JobManager:
    """Return the loaded entry's job manager (window 01:00-06:00)."""
    return entry.runtime_data.jobs


async def test_summarize_now_and_wait(
    hass: HomeAssistant, manager: JobManager, scheduler: Scheduler
) -> None:
    """``run_now`` + ``wait`` returns the server's text; the event carries text and tokens."""
    events = async_capture_events(hass, EVENT_SUMMARY_READY)
    finished: list[FinishedRequest] = []
    scheduler.add_listener(finished.append)

    response = await async_summarize(
        hass,
        text="The boiler ran for three hours.",
        name="boiler",
        run_now=True,
        wait=True,
        max_output_tokens=12,
    )
    assert response["status"] == "done"
    assert response["text"]
    assert response["output_tokens"] > 0
    assert response["prompt_note"] is None
    await hass.async_block_till_done()
    [event] = events
    assert event.data["job_id"] == response["job_id"]
    assert event.data["text"] == response["text"]
    [request] = finished
    assert request.lane is Lane.BACKGROUND
    assert request.requester == "job:boiler"
    assert request.token_source == "server"
    assert event.data["prompt_tokens"] == request.prompt_tokens


async def test_text_over_the_context_limit_is_trimmed_with_a_note(
    hass: HomeAssistant, manager: JobManager, scheduler: Scheduler
) -> None:
    """A text far over the lane's context limit is cut, and the job and event say so."""
    events = async_capture_events(hass, EVENT_SUMMARY_READY)
    finished: list[FinishedRequest] = []
    scheduler.add_listener(finished.append)
    long_text = "The garage door opened and closed again. " * 400

    response = await async_summarize(hass, text=long_text, run_now=True, wait=True)
    assert response["status"] == "done"
    note = response["prompt_note"]
    assert note is not None and f"context limit of {CONTEXT_LIMIT} tokens" in note
    job = manager.get(response["job_id"])
    assert job.prompt.endswith(f"({note})")
    assert job.prompt_tokens_estimate <= CONTEXT_LIMIT
    [request] = finished
    assert request.outcome == "ok"
    await hass.async_block_till_done()
    assert events[0].data["prompt_note"] == note


async def test_queued_outside_the_window_then_listed_and_cancelled(
    hass: HomeAssistant, manager: JobManager, freezer: FrozenDateTimeFactory
) -> None:
    """A job outside the window waits (and says why); list and cancel it; a second cancel fails."""
    freezer.move_to("2026-11-29 22:00:00+00:00")
    await hass.config.async_set_time_zone("UTC")
    response = await async_summarize(hass, text="Lights were left on.", name="lights")
    assert response["status"] == "queued"
    assert response["wait_reason"] == "outside_window"

    listed = await hass.services.async_call(
        DOMAIN, "list_jobs", {"status": "queued"}, blocking=True, return_response=True
    )
    assert listed is not None
    [job] = listed["jobs"]
    assert job["job_id"] == response["job_id"]
    assert job["name"] == "lights"
    assert job["config_entry_id"] == manager.entry_id
    assert "prompt" not in job

    cancelled = await hass.services.async_call(
        DOMAIN,
        "cancel_job",
        {"job_id": job["job_id"]},
        blocking=True,
        return_response=True,
    )
    assert cancelled == {"job_id": job["job_id"], "status": "cancelled"}
    with pytest.raises(ServiceValidationError) as err:
        await hass.services.async_call(
            DOMAIN, "cancel_job", {"job_id": job["job_id"]}, blocking=True
        )
    assert err.value.translation_key == "job_already_finished"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"name": "nothing"}, "text_or_entities"),
        ({"text": "x", "notify_target": "notify.nobody"}, "notify_target_not_found"),
        ({"text": "x", "max_output_tokens": 99999}, "max_output_tokens_too_high"),
        ({"text": "x", "config_entry_id": "other"}, "entry_not_loaded"),
    ],
)
async def test_summarize_refuses_bad_calls(
    hass: HomeAssistant, manager: JobManager, data: dict[str, Any], key: str
) -> None:
    """Bad calls fail with a translated validation error and queue nothing."""
    with pytest.raises(ServiceValidationError) as err:
        await hass.services.async_call(DOMAIN, "summarize", data, blocking=True)
    assert err.value.translation_key == key
    assert manager.jobs() == []


async def test_unknown_job(hass: HomeAssistant, manager: JobManager) -> None:
    """Cancelling an unknown job says so."""
    with pytest.raises(ServiceValidationError) as err:
        await hass.services.async_call(
            DOMAIN, "cancel_job", {"job_id": "nope"}, blocking=True
        )
    assert err.value.translation_key == "job_not_found"


async def test_job_backs_off_while_a_real_voice_stream_is_open(
    hass: HomeAssistant, manager: JobManager, scheduler: Scheduler, sim: SimulatedServer
) -> None:
    """A run-now job waits while a voice answer streams, and starts once it is done."""
    voice = scheduler.stream(
        ChatRequest(
            model=sim.config.model,
            messages=(ChatMessage(role="user", content="Turn on the lights"),),
            max_tokens=64,
        ),
        lane=Lane.VOICE,
        requester="satellite.kitchen",
    )
    first = await anext(voice)
    assert first.text
    assert scheduler.snapshot().lanes[Lane.VOICE].in_flight == 1

    response = await async_summarize(hass, text="The oven is on.", run_now=True)
    assert response["status"] == "queued"
    assert response["wait_reason"] == "house_busy"

    async for _ in voice:
        pass
    job = await manager.async_wait(response["job_id"], 60)
    assert job.status is JobStatus.DONE
    assert job.text
