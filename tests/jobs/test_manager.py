"""The job manager: window, budget, back-off, rate, retries, restart, cancel, delivery, store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from freezegun.api import FrozenDateTimeFactory
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError
import pytest
from pytest_homeassistant_custom_component.common import (
    async_capture_events,
    async_mock_service,
)
from syrupy.assertion import SnapshotAssertion
from syrupy.matchers import path_type

from custom_components.llm_lanes.const import EVENT_SUMMARY_READY
from custom_components.llm_lanes.core.errors import LimitExceededError, ServerBusyError
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.jobs.model import (
    Job,
    JobAnswer,
    JobSpec,
    JobStatus,
    WaitReason,
)
from custom_components.llm_lanes.jobs.prompts import text_prompt
from custom_components.llm_lanes.jobs.queue import MAX_FINISHED_JOBS, MAX_WAITING_JOBS
from custom_components.llm_lanes.jobs.store import STORAGE_VERSION, storage_key
from custom_components.llm_lanes.jobs.throttles import JobSettings
from tests.jobs.support import (
    ANSWER,
    ENTRY_ID,
    LoadedScheduler,
    local_time,
    move_to,
    settings,
)
from tests.support.entries import MODEL

ANSWER_TEXT = "".join(ANSWER)


def spec(name: str = "daily", **changes: Any) -> JobSpec:
    """Return a job that summarizes a short text."""
    return JobSpec(
        prompt=text_prompt("The door opened twice.", None, 16384), name=name, **changes
    )


StartManager = Callable[..., Awaitable[JobManager]]
"""Starts a job manager of the test entry (job settings optional)."""


@pytest.fixture
async def start_manager(
    hass: HomeAssistant, scheduler: LoadedScheduler
) -> AsyncIterator[StartManager]:
    """Start job managers of the test entry (the default window unless told); stop them after."""
    async with AsyncExitStack() as stops:

        async def start(job_settings: JobSettings | None = None) -> JobManager:
            manager = JobManager(
                hass,
                ENTRY_ID,
                scheduler,
                model=MODEL,
                settings=job_settings or settings(),
            )
            await manager.async_start()
            stops.push_async_callback(manager.async_stop)
            return manager

        yield start


@pytest.fixture
def night(freezer: FrozenDateTimeFactory) -> FrozenDateTimeFactory:
    """Set the clock to 02:00 on November 30th, inside the default run window."""
    freezer.move_to(local_time(30, 2))
    return freezer


@pytest.fixture
def scheduler() -> LoadedScheduler:
    """Return a quiet scheduler."""
    return LoadedScheduler()


async def test_job_waits_for_the_window_then_runs(
    hass: HomeAssistant,
    freezer: FrozenDateTimeFactory,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """A job queued in the afternoon waits until 01:00, then runs in the background lane."""
    freezer.move_to(local_time(29, 14))
    events = async_capture_events(hass, EVENT_SUMMARY_READY)
    manager = await start_manager()

    job = await manager.async_submit(spec())
    await hass.async_block_till_done(wait_background_tasks=True)
    assert job.status is JobStatus.QUEUED
    assert job.wait_reason is WaitReason.OUTSIDE_WINDOW
    assert scheduler.calls == []

    await move_to(hass, freezer, local_time(30, 0, 59, 50))
    assert job.status is JobStatus.QUEUED

    await move_to(hass, freezer, local_time(30, 1, 0, 5))
    assert job.status is JobStatus.DONE
    assert job.text == ANSWER_TEXT
    [call] = scheduler.calls
    assert call.lane is Lane.BACKGROUND
    assert call.requester == "job:daily"
    assert call.request.model == MODEL
    [event] = events
    assert event.data["job_id"] == job.id
    assert event.data["text"] == ANSWER_TEXT
    assert event.data["output_tokens"] == len(ANSWER)
    assert event.data["prompt_tokens"] == job.prompt_tokens > 0
    assert event.data["wait_s"] == pytest.approx(11 * 3600 + 5, abs=1)
    assert manager.done_tonight == 1
    assert manager.tokens_tonight == job.prompt_tokens + job.output_tokens


async def test_run_now_skips_the_window(
    hass: HomeAssistant,
    freezer: FrozenDateTimeFactory,
    start_manager: StartManager,
) -> None:
    """``run_now`` runs at once in the afternoon; the caller can wait for the text."""
    freezer.move_to(local_time(29, 14))
    manager = await start_manager()
    job = await manager.async_submit(spec(run_now=True))
    finished = await manager.async_wait(job.id, 5)
    assert finished.status is JobStatus.DONE
    assert finished.text == ANSWER_TEXT


async def test_budget_spent_defers_to_the_next_night(
    hass: HomeAssistant,
    freezer: FrozenDateTimeFactory,
    start_manager: StartManager,
) -> None:
    """Once the night's budget is spent, the other jobs wait for the next night and say so."""
    freezer.move_to(local_time(30, 1, 30))
    manager = await start_manager(settings(nightly_token_budget=20))
    first = await manager.async_submit(spec("first"))
    await hass.async_block_till_done(wait_background_tasks=True)
    assert first.status is JobStatus.DONE
    assert manager.tokens_tonight >= 20
    assert manager.budget_spent

    second = await manager.async_submit(spec("second"))
    await hass.async_block_till_done(wait_background_tasks=True)
    assert second.status is JobStatus.QUEUED
    assert second.wait_reason is WaitReason.BUDGET_SPENT

    await move_to(hass, freezer, local_time(30, 5, 59))
    assert second.wait_reason is WaitReason.BUDGET_SPENT
    await move_to(hass, freezer, local_time(30, 14))
    assert second.wait_reason is WaitReason.OUTSIDE_WINDOW
    assert manager.done_tonight == 1

    await move_to(hass, freezer, local_time(1, 1, 0, 10).replace(month=12))
    assert second.status is JobStatus.DONE
    assert manager.done_tonight == 1
    assert manager.tokens_tonight == second.prompt_tokens + second.output_tokens


async def test_backs_off_while_voice_streams(
    hass: HomeAssistant,
    night: FrozenDateTimeFactory,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """No job starts while a voice request streams; it starts when voice is done."""
    scheduler.voice_in_flight = 1
    manager = await start_manager()
    job = await manager.async_submit(spec())
    await move_to(hass, night, local_time(30, 2, 1))
    assert job.status is JobStatus.QUEUED
    assert job.wait_reason is WaitReason.HOUSE_BUSY
    assert scheduler.calls == []

    scheduler.voice_finished()
    await hass.async_block_till_done(wait_background_tasks=True)
    assert job.status is JobStatus.DONE


async def test_backs_off_while_goodput_is_below_objective(
    hass: HomeAssistant,
    night: FrozenDateTimeFactory,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """Jobs hold back while voice goodput over the last minute misses its objective."""
    scheduler.voice_goodput = 0.5
    manager = await start_manager()
    job = await manager.async_submit(spec())
    await hass.async_block_till_done(wait_background_tasks=True)
    assert job.wait_reason is WaitReason.HOUSE_BUSY

    scheduler.voice_goodput = 1.0
    await move_to(hass, night, local_time(30, 2, 1))
    assert job.status is JobStatus.DONE


async def test_token_rate_limit(
    hass: HomeAssistant,
    night: FrozenDateTimeFactory,
    start_manager: StartManager,
) -> None:
    """A job that overdraws the token bucket holds the next one back until it refills."""
    manager = await start_manager(settings(tokens_per_minute=30))
    first = await manager.async_submit(spec("first"))
    await hass.async_block_till_done(wait_background_tasks=True)
    used = first.prompt_tokens + first.output_tokens
    assert used > 30

    second = await manager.async_submit(spec("second"))
    await hass.async_block_till_done(wait_background_tasks=True)
    assert second.wait_reason is WaitReason.RATE_LIMIT
    # The debt (used - 30 tokens) is paid back at 30 tokens a minute.
    await move_to(hass, night, local_time(30, 2, 0, 20))
    assert second.status is JobStatus.QUEUED
    minutes = (used - 30) / 30
    await move_to(hass, night, local_time(30, 2, int(minutes) + 1, 10))
    assert second.status is JobStatus.DONE


async def test_server_errors_retry_with_back_off_then_fail(
    hass: HomeAssistant,
    night: FrozenDateTimeFactory,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """A busy server is retried after 1 then 2 minutes; the third failure fails the job."""
    scheduler.failures = [ServerBusyError("busy", status=503) for _ in range(3)]
    manager = await start_manager()
    job = await manager.async_submit(spec())
    await hass.async_block_till_done(wait_background_tasks=True)
    assert job.status is JobStatus.QUEUED
    assert job.attempts == 1
    assert job.wait_reason is WaitReason.RETRY_BACKOFF
    assert job.last_error is not None and "ServerBusyError" in job.last_error

    await move_to(hass, night, local_time(30, 2, 0, 50))
    assert job.attempts == 1
    await move_to(hass, night, local_time(30, 2, 1, 5))
    assert job.attempts == 2
    await move_to(hass, night, local_time(30, 2, 3, 15))
    assert job.attempts == 3
    assert job.status is JobStatus.FAILED
    assert "busy" in (job.last_error or "")


@pytest.mark.usefixtures("night")
async def test_limit_errors_fail_at_once(
    hass: HomeAssistant,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """An error another attempt would meet again fails the job on the first attempt."""
    scheduler.failures = [
        LimitExceededError(
            lane="background", limit="max_tokens", value=9e3, maximum=4096
        )
    ]
    manager = await start_manager()
    job = await manager.async_submit(spec())
    await hass.async_block_till_done(wait_background_tasks=True)
    assert job.status is JobStatus.FAILED
    assert job.attempts == 1


async def test_interrupted_job_completes_exactly_once_after_restart(
    hass: HomeAssistant,
    night: FrozenDateTimeFactory,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
    hass_storage: dict[str, Any],
) -> None:
    """A job stopped mid-stream by an unload is stored as interrupted and runs once after reload.

    The interrupted start gives its attempt back: an unload is not a failure.
    """
    events = async_capture_events(hass, EVENT_SUMMARY_READY)
    scheduler.hold = asyncio.Event()
    manager = await start_manager()
    job = await manager.async_submit(spec())
    await hass.async_block_till_done()
    assert job.status is JobStatus.RUNNING

    await manager.async_stop()
    [first_call] = scheduler.calls
    assert first_call.closed
    [stored] = hass_storage[storage_key(ENTRY_ID)]["data"]["jobs"]
    assert stored["status"] == "queued"
    assert stored["interrupted"] is True
    assert stored["attempts"] == 0

    scheduler.hold = None
    reloaded = await start_manager()
    await hass.async_block_till_done(wait_background_tasks=True)
    again = reloaded.get(job.id)
    assert again.status is JobStatus.DONE
    assert again.attempts == 1
    assert len(scheduler.calls) == 2
    assert len(events) == 1
    await reloaded.async_stop()

    third = await start_manager()
    await move_to(hass, night, local_time(30, 2, 5))
    assert third.get(job.id).status is JobStatus.DONE
    assert len(scheduler.calls) == 2
    assert len(events) == 1


@pytest.mark.usefixtures("night")
async def test_job_left_running_by_a_crash_runs_again(
    hass: HomeAssistant,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
    hass_storage: dict[str, Any],
) -> None:
    """A job stored as running (no clean stop) is queued again on load; a finished one stays."""
    left_running = Job.from_spec("abc", spec("old"), local_time(29, 23))
    left_running.start(local_time(30, 1, 5))
    finished = Job.from_spec("def", spec("finished"), local_time(29, 22))
    finished.start(local_time(29, 22, 1))
    finished.record(JobAnswer("Earlier.", 20, 2, "server", 0.1))
    finished.finish(JobStatus.DONE, local_time(29, 22, 5))
    hass_storage[storage_key(ENTRY_ID)] = {
        "version": STORAGE_VERSION,
        "minor_version": 1,
        "key": storage_key(ENTRY_ID),
        "data": {
            "jobs": [left_running.as_stored(), finished.as_stored()],
            "ledger": {"night": None, "tokens": 0, "jobs_done": 0},
            "paused": False,
        },
    }
    manager = await start_manager()
    await hass.async_block_till_done(wait_background_tasks=True)
    assert manager.get("abc").status is JobStatus.DONE
    assert manager.get("abc").attempts == 1
    assert manager.get("def").text == "Earlier."
    assert [call.requester for call in scheduler.calls] == ["job:old"]
    await manager.async_stop()


@pytest.mark.usefixtures("night")
async def test_cancel_queued_and_running_jobs(
    hass: HomeAssistant,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """Cancel drops a queued job, and stops a running one (its stream is closed)."""
    scheduler.hold = asyncio.Event()
    manager = await start_manager()
    running = await manager.async_submit(spec("running"))
    queued = await manager.async_submit(spec("queued"))
    await hass.async_block_till_done()
    assert running.status is JobStatus.RUNNING
    assert queued.wait_reason is WaitReason.IN_FLIGHT_LIMIT

    await manager.async_cancel(queued.id)
    assert queued.status is JobStatus.CANCELLED
    await manager.async_cancel(running.id)
    assert running.status is JobStatus.CANCELLED
    assert scheduler.calls[0].closed
    assert len(scheduler.calls) == 1


@pytest.mark.usefixtures("night")
async def test_notify_and_persistent_notification(
    hass: HomeAssistant,
    start_manager: StartManager,
) -> None:
    """A finished job is sent to its notify service and shown as a persistent notification."""
    sent = async_mock_service(hass, "notify", "family_phone")
    manager = await start_manager()
    job = await manager.async_submit(
        spec(
            "evening", notify_target="notify.family_phone", persistent_notification=True
        )
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert job.status is JobStatus.DONE
    [call] = sent
    assert call.data == {"title": "evening", "message": ANSWER_TEXT}
    notifications = hass.data["persistent_notification"]
    assert notifications[f"llm_lanes_job_{job.id}"]["message"] == ANSWER_TEXT


@pytest.mark.usefixtures("night")
async def test_notify_entity_and_a_target_gone_by_delivery(
    hass: HomeAssistant, start_manager: StartManager, caplog: pytest.LogCaptureFixture
) -> None:
    """A notify entity gets ``notify.send_message``; a target gone by then only logs a warning."""
    sent = async_mock_service(hass, "notify", "send_message")
    hass.states.async_set("notify.kitchen_display", "unknown")
    manager = await start_manager()
    shown = await manager.async_submit(
        spec("shown", notify_target="notify.kitchen_display")
    )
    gone = await manager.async_submit(spec("gone", notify_target="notify.old_phone"))
    await hass.async_block_till_done(wait_background_tasks=True)
    assert [call.data for call in sent] == [
        {
            "entity_id": "notify.kitchen_display",
            "title": "shown",
            "message": ANSWER_TEXT,
        }
    ]
    assert shown.status is JobStatus.DONE
    assert gone.status is JobStatus.DONE
    assert f"Job {gone.id}: could not notify notify.old_phone" in caplog.text


async def test_retention_forgets_old_finished_jobs(
    hass: HomeAssistant,
    freezer: FrozenDateTimeFactory,
    start_manager: StartManager,
) -> None:
    """Finished jobs are kept for the retention period, then forgotten."""
    freezer.move_to(local_time(20, 2))
    manager = await start_manager(settings(retention_days=2))
    job = await manager.async_submit(spec())
    await hass.async_block_till_done(wait_background_tasks=True)
    assert job.status is JobStatus.DONE
    await move_to(hass, freezer, local_time(21, 2, 5))
    assert manager.jobs() == [job]
    await move_to(hass, freezer, local_time(22, 2, 5))
    assert manager.jobs() == []


@pytest.mark.usefixtures("night")
async def test_cancel_and_stop_before_the_first_step(
    hass: HomeAssistant,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """A job cancelled (or stopped) before its task ran a step still ends in the right state."""
    manager = await start_manager()
    cancelled = await manager.async_submit(spec("cancelled"))
    assert cancelled.status is JobStatus.RUNNING
    await manager.async_cancel(cancelled.id)
    assert cancelled.status is JobStatus.CANCELLED

    stopped = await manager.async_submit(spec("stopped"))
    assert stopped.status is JobStatus.RUNNING
    await manager.async_stop()
    assert stopped.status is JobStatus.QUEUED
    assert stopped.interrupted
    assert scheduler.calls == []


@pytest.mark.usefixtures("night")
async def test_stored_document_and_event_layout(
    hass: HomeAssistant,
    start_manager: StartManager,
    hass_storage: dict[str, Any],
    snapshot: SnapshotAssertion,
) -> None:
    """The Store document (key, versions, jobs, ledger, pause) and the event keep their layout.

    A job that ran, and one that waits because jobs are paused. The clock is frozen; the jobs'
    random ids, and the token counts (the engine's estimate), are checked by type only.
    """
    events = async_capture_events(hass, EVENT_SUMMARY_READY)
    manager = await start_manager()
    await manager.async_submit(spec("ran", persistent_notification=True))
    await hass.async_block_till_done(wait_background_tasks=True)
    manager.set_paused(True)
    await manager.async_submit(spec("waits", max_output_tokens=64))
    await manager.async_stop()
    by_type = path_type(
        {
            r"(.*\.)?(job_)?id": (str,),
            r".*prompt_tokens(_estimate)?|.*\.tokens": (int,),
        },
        regex=True,
    )
    assert hass_storage[storage_key(ENTRY_ID)] == snapshot(matcher=by_type)
    [event] = events
    assert event.data == snapshot(matcher=by_type)


async def test_restarts_do_not_use_up_the_retries(
    hass: HomeAssistant,
    night: FrozenDateTimeFactory,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """Two restarts mid-stream and one server failure leave the job retrying, not failed."""
    scheduler.hold = asyncio.Event()
    manager = await start_manager()
    job = await manager.async_submit(spec())
    for _ in range(2):
        await hass.async_block_till_done()
        assert manager.get(job.id).status is JobStatus.RUNNING
        await manager.async_stop()
        manager = await start_manager()
    await hass.async_block_till_done()
    await manager.async_stop()
    assert len(scheduler.calls) == 3

    scheduler.hold = None
    scheduler.failures = [ServerBusyError("busy", status=503)]
    manager = await start_manager()
    await hass.async_block_till_done(wait_background_tasks=True)
    again = manager.get(job.id)
    assert again.status is JobStatus.QUEUED
    assert again.wait_reason is WaitReason.RETRY_BACKOFF
    assert again.attempts == 1

    await move_to(hass, night, local_time(30, 2, 1, 10))
    assert again.status is JobStatus.DONE
    assert again.attempts == 2


@pytest.mark.usefixtures("night")
async def test_jobs_wait_while_the_server_is_unreachable(
    hass: HomeAssistant, scheduler: LoadedScheduler
) -> None:
    """No job starts while the server is down; a waiting caller is answered at once."""
    up = False
    manager = JobManager(
        hass,
        ENTRY_ID,
        scheduler,
        model=MODEL,
        settings=settings(),
        reachable=lambda: up,
    )
    await manager.async_start()
    job = await manager.async_submit(spec(run_now=True))
    assert job.wait_reason is WaitReason.SERVER_UNREACHABLE
    waited = await manager.async_wait(job.id, 3600, answer_long_waits=True)
    assert waited.status is JobStatus.QUEUED
    assert scheduler.calls == []

    up = True
    manager.reachability_changed()
    finished = await manager.async_wait(job.id, 3600)
    assert finished.status is JobStatus.DONE
    assert len(scheduler.calls) == 1
    await manager.async_stop()


async def test_a_waiting_caller_is_answered_when_the_job_backs_off(
    hass: HomeAssistant,
    night: FrozenDateTimeFactory,
    scheduler: LoadedScheduler,
    start_manager: StartManager,
) -> None:
    """A failed attempt hands the job back to a caller who asked: queued, the reason, the error.

    A caller who did not ask goes on waiting, until the retry is done.
    """
    scheduler.failures = [ServerBusyError("busy", status=503)]
    manager = await start_manager()
    job = await manager.async_submit(spec(run_now=True))
    patient = hass.async_create_task(manager.async_wait(job.id, 3600))
    waited = await manager.async_wait(job.id, 3600, answer_long_waits=True)
    assert waited.status is JobStatus.QUEUED
    assert waited.wait_reason is WaitReason.RETRY_BACKOFF
    assert waited.last_error is not None and "busy" in waited.last_error
    assert not patient.done()

    await move_to(hass, night, local_time(30, 2, 1, 10))
    assert (await patient).status is JobStatus.DONE


@pytest.mark.usefixtures("night")
async def test_the_store_keeps_a_bounded_number_of_jobs(
    hass: HomeAssistant,
    start_manager: StartManager,
    hass_storage: dict[str, Any],
) -> None:
    """At most MAX_WAITING_JOBS wait (one more is refused, unstored); the oldest finished go."""
    manager = await start_manager()
    manager.set_paused(True)
    waiting = [
        await manager.async_submit(spec(f"w{i}")) for i in range(MAX_WAITING_JOBS)
    ]
    with pytest.raises(ServiceValidationError) as err:
        await manager.async_submit(spec("one too many"))
    assert err.value.translation_key == "too_many_jobs"
    stored = hass_storage[storage_key(ENTRY_ID)]["data"]["jobs"]
    assert len(stored) == MAX_WAITING_JOBS

    manager.set_paused(False)
    await hass.async_block_till_done(wait_background_tasks=True)
    later = []
    for i in range(MAX_FINISHED_JOBS - MAX_WAITING_JOBS + 5):
        later.append(await manager.async_submit(spec(f"l{i}")))
        await hass.async_block_till_done(wait_background_tasks=True)
    kept = manager.jobs()
    assert len(kept) == MAX_FINISHED_JOBS
    assert all(job.status is JobStatus.DONE and job.prompt == "" for job in kept)
    assert {job.id for job in waiting[:5]}.isdisjoint(job.id for job in kept)
    assert {job.id for job in later} <= {job.id for job in kept}
