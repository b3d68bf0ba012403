"""The job manager of one config entry: its queue, throttles, runs and deliveries.

The manager starts a queued job only when every throttle allows it:

- the run window is open (default 01:00-06:00 local time) and the night's token budget is not
  spent (it resets when the next window opens); a job asked to run now skips these two;
- fewer than ``max_in_flight`` jobs run, the token bucket (tokens per minute) is not in debt,
  jobs are not paused, the server answers, and the house is quiet: no voice or interactive
  request is queued or streaming, and those lanes' goodput over the scheduler's window meets the
  objective.

Once started, a job is the scheduler's business like any other background request (it may be
preempted for voice and resumed). Server errors retry with exponential back-off up to
``max_attempts``. A job that is streaming when the entry unloads goes back to the queue marked
``interrupted`` and runs again, once, after the next load, without using up an attempt; finished
jobs never run again (and keep no prompt). What is kept, and for how long, is the ``JobQueue``'s
business (``queue``); the callers waiting for a job and the entities are told by ``waiters``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import uuid4

from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.helpers.event import async_track_time_interval
import homeassistant.util.dt as dt_util

from custom_components.llm_lanes.const import DOMAIN, LOGGER
from custom_components.llm_lanes.core.errors import LanesError, SchedulerClosedError
from custom_components.llm_lanes.core.lanes import Lane, LaneLimits
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from custom_components.llm_lanes.error_translation import validation_error
from custom_components.llm_lanes.jobs.delivery import async_deliver
from custom_components.llm_lanes.jobs.model import Job, JobSpec, JobStatus, WaitReason
from custom_components.llm_lanes.jobs.queue import JobQueue
from custom_components.llm_lanes.jobs.run import (
    NON_RETRYABLE_ERRORS,
    JobRoute,
    SchedulerRoute,
    async_stream_answer,
)
from custom_components.llm_lanes.jobs.throttles import (
    QUIET_LANES,
    JobSettings,
    TokenBucket,
    house_busy,
    own_wait_reason,
)
from custom_components.llm_lanes.jobs.waiters import JobWaiters
from custom_components.llm_lanes.listeners import Listeners

TICK_INTERVAL = timedelta(seconds=10)
"""How often waiting jobs are looked at again (window, bucket, back-off, retries, retention)."""


@dataclass(slots=True)
class _Running:
    job: Job
    task: asyncio.Task[None]
    cancelled_by_user: bool = False


class JobManager:
    """The queue, throttles, runs and deliveries of one config entry's jobs."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry_id: str,
        scheduler: Scheduler,
        *,
        model: str,
        settings: JobSettings | None = None,
        reachable: Callable[[], bool] = lambda: True,
        route: JobRoute | None = None,
    ) -> None:
        """Create the manager; nothing runs before ``async_start``.

        Jobs go to ``scheduler`` while ``reachable`` says the server answers, or where ``route``
        sends them (the household's pool), when it says they can run; call
        ``reachability_changed`` when that changes.
        """
        self.hass = hass
        self.entry_id = entry_id
        self._scheduler = scheduler
        self._route = route or SchedulerRoute(scheduler, reachable)
        self._model = model
        self._settings = settings or JobSettings()
        self._queue = JobQueue(hass, entry_id)
        self._running: dict[str, _Running] = {}
        self._bucket = TokenBucket(self._settings.tokens_per_minute, self._now_ts())
        self._listeners = Listeners()
        self._waiters = JobWaiters(hass)
        self._unsubscribers: list[Callable[[], None]] = []
        self._started = False
        self._stopping = False
        self._pump_scheduled = False

    # --- life cycle ------------------------------------------------------------------------

    async def async_start(self) -> None:
        """Load the stored jobs, requeue interrupted ones, and start looking at the queue."""
        await self._queue.async_load()
        self._prune(dt_util.utcnow())
        self._started = True
        self._unsubscribers.append(
            async_track_time_interval(
                self.hass, self._async_tick, TICK_INTERVAL, name=f"{DOMAIN} jobs"
            )
        )
        self._unsubscribers.append(
            self._scheduler.add_listener(self._on_request_finished)
        )
        await self._queue.async_save()
        self._pump()

    async def async_stop(self) -> None:
        """Stop every running job, keep it queued as interrupted, and write the store."""
        self._stopping = True
        while self._unsubscribers:
            self._unsubscribers.pop()()
        for running in list(self._running.values()):
            await self._async_stop_run(running)
        self._waiters.cancel_all()
        await self._queue.async_save()

    # --- settings and state ------------------------------------------------------------------

    @property
    def settings(self) -> JobSettings:
        """The current throttles."""
        return self._settings

    @callback
    def update_settings(self, settings: JobSettings) -> None:
        """Apply new throttles (from the options flow) without a reload."""
        self._settings = settings
        self._bucket.set_rate(settings.tokens_per_minute, self._now_ts())
        self._listeners.changed()  # the entities show the budget
        self._schedule_pump()

    @property
    def limits(self) -> LaneLimits:
        """The background lane's limits: the context a job's prompt is trimmed to, its output."""
        return self._scheduler.settings.lanes[Lane.BACKGROUND]

    @property
    def paused(self) -> bool:
        """Whether no new job may start (running ones finish)."""
        return self._queue.paused

    @callback
    def set_paused(self, paused: bool) -> None:
        """Pause or resume the jobs (the switch)."""
        self._queue.paused = paused
        self._queue.save()
        self._listeners.changed()
        self._schedule_pump()

    def jobs(self) -> list[Job]:
        """Every known job, oldest first."""
        return sorted(self._queue, key=lambda job: job.created_at)

    def has_job(self, job_id: str) -> bool:
        """Whether this entry holds a job with this id."""
        return job_id in self._queue

    def get(self, job_id: str) -> Job:
        """One job by id (a translated validation error when there is none)."""
        return self._queue.get(job_id)

    @property
    def waiting_count(self) -> int:
        """Queued jobs."""
        return sum(job.status is JobStatus.QUEUED for job in self._queue)

    def waiting_because(self) -> dict[str, int]:
        """How many unfinished jobs wait for each reason."""
        return self._queue.waiting_because()

    @property
    def running_count(self) -> int:
        """Jobs streaming now."""
        return len(self._running)

    @property
    def done_tonight(self) -> int:
        """Jobs finished since the window last opened."""
        self._roll_night()
        return self._queue.ledger.jobs_done

    @property
    def tokens_tonight(self) -> int:
        """Tokens jobs used since the window last opened."""
        self._roll_night()
        return self._queue.ledger.tokens

    @property
    def budget_spent(self) -> bool:
        """Whether the night's token budget is used up."""
        return self._settings.budget_spent(self.tokens_tonight)

    @callback
    def reachability_changed(self) -> None:
        """Look at the queue again: the server went down or came back."""
        self._schedule_pump()

    @callback
    def add_listener(self, listener: Callable[[], None]) -> CALLBACK_TYPE:
        """Be called when jobs or counters change (for the entities)."""
        return self._listeners.add(listener)

    # --- actions ------------------------------------------------------------------------------

    @callback
    def check_room(self) -> None:
        """Refuse a new job while ``MAX_WAITING_JOBS`` wait (a translated validation error)."""
        self._queue.check_room()

    async def async_submit(self, spec: JobSpec) -> Job:
        """Queue a new job and look at the queue at once (it may start now)."""
        self._queue.check_room()
        job = Job.from_spec(uuid4().hex, spec, dt_util.utcnow())
        self._queue.add(job)
        LOGGER.debug("Job %s queued (requester %s)", job.id, job.requester)
        await self._queue.async_save()
        self._pump()
        return job

    async def async_cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job."""
        job = self.get(job_id)
        if job.status.finished:
            raise validation_error(
                "job_already_finished", job_id=job_id, status=job.status.value
            )
        running = self._running.get(job_id)
        if running is not None:
            running.cancelled_by_user = True
            await self._async_stop_run(running)
        else:
            self._finish(job, JobStatus.CANCELLED)
        return job

    async def _async_stop_run(self, running: _Running) -> None:
        """Cancel a job's task and wait for it; its stream is closed at the server."""
        running.task.cancel()
        await asyncio.gather(running.task, return_exceptions=True)
        if running.job.status is JobStatus.RUNNING:
            # Cancelled before its first step: the task's own handlers never ran.
            self._cancelled(running.job)

    @callback
    def _cancelled(self, job: Job) -> None:
        """End a run whose task was cancelled: by the user (for good), else by an unload."""
        running = self._running.pop(job.id, None)
        if running is not None and running.cancelled_by_user:
            self._finish(job, JobStatus.CANCELLED)
        else:
            # The entry unloads or Home Assistant stops.
            self._interrupt(job)

    async def async_wait(
        self, job_id: str, timeout: float, *, answer_long_waits: bool = False
    ) -> Job:
        """Wait until the job finished, or ``timeout`` seconds; return it as it is then.

        With ``answer_long_waits``, also return (at once if it is so already) when the job waits
        for something that takes long (``WaitReason.is_long``: the server is down, a retry's
        back-off, jobs are paused).
        """
        job = self.get(job_id)
        if job.status.finished or (answer_long_waits and job.waits_long):
            return job
        return await self._waiters.async_wait(
            job, timeout, answer_long_waits=answer_long_waits
        )

    # --- deciding what runs ------------------------------------------------------------------

    def _now_ts(self) -> float:
        return dt_util.utcnow().timestamp()

    def _roll_night(self) -> None:
        if self._queue.ledger.roll(
            self._settings.night_start(dt_util.now()).isoformat()
        ):
            self._queue.save()

    @callback
    def _on_request_finished(self, finished: FinishedRequest) -> None:
        if finished.lane in QUIET_LANES:
            self._schedule_pump()

    @callback
    def _async_tick(self, _now: datetime) -> None:
        self._prune(dt_util.utcnow())
        self._pump()

    @callback
    def _schedule_pump(self) -> None:
        if self._pump_scheduled or not self._started or self._stopping:
            return
        self._pump_scheduled = True

        def run() -> None:
            self._pump_scheduled = False
            self._pump()

        self.hass.loop.call_soon(run)

    @callback
    def _shared_wait_reason(self, job: Job) -> WaitReason | None:
        """Why ``job`` may not start now for a reason it shares with others (None: it may)."""
        if self._queue.paused:
            return WaitReason.PAUSED
        if not self._route.reachable(job):
            return WaitReason.SERVER_UNREACHABLE
        if len(self._running) >= self._settings.max_in_flight:
            return WaitReason.IN_FLIGHT_LIMIT
        if house_busy(self._scheduler.snapshot(), self._settings.goodput_objective):
            return WaitReason.HOUSE_BUSY
        if not self._bucket.allows_start(self._now_ts()):
            return WaitReason.RATE_LIMIT
        return None

    @callback
    def _pump(self) -> None:
        """Start every queued job the throttles allow; record why the others wait."""
        if not self._started or self._stopping:
            return
        self._roll_night()
        now = dt_util.utcnow()
        window_open = self._settings.in_window(dt_util.as_local(now))
        budget_spent = self.budget_spent
        changed = False
        for job in self._queue.queued():
            reason = own_wait_reason(
                job, now, window_open=window_open, budget_spent=budget_spent
            ) or self._shared_wait_reason(job)
            if reason is None:
                self._start(job)
                changed = True
                continue
            if job.wait_reason is not reason:
                job.wait_reason = reason
                changed = True
                if reason.is_long:
                    self._waiters.answer(job, finished=False)
        if changed:
            self._queue.save()
            self._listeners.changed()

    @callback
    def _start(self, job: Job) -> None:
        job.start(dt_util.utcnow())
        LOGGER.debug("Job %s starts (attempt %s)", job.id, job.attempts)
        task = self.hass.async_create_background_task(
            self._async_run(job), f"{DOMAIN} job {job.id}", eager_start=False
        )
        self._running[job.id] = _Running(job, task)

    # --- running one job ------------------------------------------------------------------------

    async def _async_run(self, job: Job) -> None:
        try:
            answer = await async_stream_answer(self._route, job, self._model)
        except asyncio.CancelledError:
            self._cancelled(job)
            raise
        except SchedulerClosedError:
            self._running.pop(job.id, None)
            self._interrupt(job)
            return
        except LanesError as err:
            self._running.pop(job.id, None)
            self._failed_attempt(
                job, err, retryable=not isinstance(err, NON_RETRYABLE_ERRORS)
            )
        except Exception as err:  # noqa: BLE001 - any failure of a job is recorded on it
            self._running.pop(job.id, None)
            self._failed_attempt(job, err, retryable=True)
        else:
            self._running.pop(job.id, None)
            job.record(answer)
            self._charge(job.prompt_tokens + job.output_tokens)
            self._finish(job, JobStatus.DONE)
            # Written before delivery, so that a crash from here on never runs the job again.
            await self._queue.async_save()
            await async_deliver(self.hass, self.entry_id, job)
        self._pump()

    @callback
    def _interrupt(self, job: Job) -> None:
        """Put a job stopped by an unload back in the queue, to run again once after the next load."""
        job.interrupt()
        LOGGER.debug("Job %s interrupted; it runs again after the next start", job.id)
        self._queue.save()

    @callback
    def _failed_attempt(self, job: Job, err: Exception, *, retryable: bool) -> None:
        reason = getattr(err, "message", None) or str(err) or type(err).__name__
        job.last_error = f"{type(err).__name__}: {reason}"
        if retryable and job.attempts < self._settings.max_attempts:
            job.status = JobStatus.QUEUED
            job.not_before = dt_util.utcnow() + self._settings.retry_delay(job.attempts)
            job.wait_reason = WaitReason.RETRY_BACKOFF
            LOGGER.info(
                "Job %s attempt %s failed (%s); retrying after %s",
                job.id,
                job.attempts,
                type(err).__name__,
                job.not_before.isoformat(),
            )
            self._waiters.answer(job, finished=False)
            self._queue.save()
            self._listeners.changed()
            return
        LOGGER.warning(
            "Job %s failed after %s attempts: %s", job.id, job.attempts, job.last_error
        )
        self._finish(job, JobStatus.FAILED)

    @callback
    def _charge(self, tokens: int) -> None:
        self._roll_night()
        self._queue.ledger.tokens += tokens
        self._bucket.spend(tokens, self._now_ts())

    @callback
    def _finish(self, job: Job, status: JobStatus) -> None:
        job.finish(status, dt_util.utcnow())
        if status is JobStatus.DONE:
            self._roll_night()
            self._queue.ledger.jobs_done += 1
        self._waiters.answer(job)
        self._prune(job.finished_at or dt_util.utcnow())
        self._queue.save()
        self._listeners.changed()

    def _prune(self, now: datetime) -> None:
        """Forget finished jobs past the retention period or the most kept (``JobQueue.prune``)."""
        if self._queue.prune(now, self._settings.retention_days):
            self._queue.save()
            self._listeners.changed()
