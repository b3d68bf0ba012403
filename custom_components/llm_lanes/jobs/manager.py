"""The job manager of one config entry: its queue, throttles, runs and deliveries.

The manager keeps the jobs in a ``JobStore`` and starts one only when every throttle allows it:

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
jobs never run again (and keep no prompt). At most ``MAX_WAITING_JOBS`` jobs wait at once and
``MAX_FINISHED_JOBS`` finished ones are kept, so the store stays small whatever callers send.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import uuid4

from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.helpers.event import async_track_time_interval
import homeassistant.util.dt as dt_util

from ..const import DOMAIN, LOGGER  # noqa: TID252
from ..core.errors import LanesError, SchedulerClosedError  # noqa: TID252
from ..core.lanes import Lane  # noqa: TID252
from ..core.scheduler import Scheduler  # noqa: TID252
from ..core.snapshot import FinishedRequest  # noqa: TID252
from ..errors import validation_error  # noqa: TID252
from .delivery import async_deliver
from .model import Job, JobSpec, JobStatus, WaitReason
from .run import NON_RETRYABLE_ERRORS, async_stream_answer
from .store import SAVE_DELAY_S, JobStore, JobStoreData
from .throttles import (
    QUIET_LANES,
    JobSettings,
    NightLedger,
    TokenBucket,
    house_busy,
    own_wait_reason,
)

TICK_INTERVAL = timedelta(seconds=10)
"""How often waiting jobs are looked at again (window, bucket, back-off, retries, retention)."""
MAX_WAITING_JOBS = 50
"""Queued and running jobs of one server; one more is refused before anything is stored."""
MAX_FINISHED_JOBS = 100
"""Finished jobs kept (within the retention period); the oldest are forgotten first."""


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Job]
    answer_long_waits: bool


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
    ) -> None:
        """Create the manager; nothing runs before ``async_start``.

        ``reachable`` tells whether the server answers now; call ``reachability_changed`` when
        that changes.
        """
        self.hass = hass
        self.entry_id = entry_id
        self._scheduler = scheduler
        self._reachable = reachable
        self._model = model
        self._settings = settings or JobSettings()
        self._store = JobStore(hass, entry_id)
        self._jobs: dict[str, Job] = {}
        self._running: dict[str, _Running] = {}
        self._ledger = NightLedger()
        self._paused = False
        self._bucket = TokenBucket(self._settings.tokens_per_minute, self._now_ts())
        self._listeners: list[Callable[[], None]] = []
        self._waiters: dict[str, list[_Waiter]] = {}
        self._unsubscribers: list[Callable[[], None]] = []
        self._started = False
        self._stopping = False
        self._pump_scheduled = False

    # --- life cycle ------------------------------------------------------------------------

    async def async_start(self) -> None:
        """Load the stored jobs, requeue interrupted ones, and start looking at the queue."""
        stored = await self._store.async_load()
        if stored is not None:
            self._restore(stored)
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
        await self._store.async_save(self._as_store_data())
        self._pump()

    async def async_stop(self) -> None:
        """Stop every running job, keep it queued as interrupted, and write the store."""
        self._stopping = True
        while self._unsubscribers:
            self._unsubscribers.pop()()
        for running in list(self._running.values()):
            await self._async_stop_run(running)
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.cancel()
        self._waiters.clear()
        await self._store.async_save(self._as_store_data())

    def _restore(self, stored: JobStoreData) -> None:
        for raw in stored["jobs"]:
            job = Job.from_stored(raw)
            if job.status is JobStatus.RUNNING:
                # The last run stopped without saying how it ended (a crash, or a stop that
                # could not write): it has not finished, so it runs again.
                job.interrupt()
            self._jobs[job.id] = job
        self._ledger = NightLedger.from_stored(stored["ledger"])
        self._paused = stored["paused"]

    def _as_store_data(self) -> JobStoreData:
        return {
            "jobs": [job.as_stored() for job in self._jobs.values()],
            "ledger": self._ledger.as_stored(),
            "paused": self._paused,
        }

    @callback
    def _save(self) -> None:
        self._store.async_delay_save(self._as_store_data, SAVE_DELAY_S)

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
        self._changed()  # the entities show the budget
        self._schedule_pump()

    @property
    def max_prompt_tokens(self) -> int:
        """The background lane's context limit (what a job's prompt is trimmed to)."""
        return self._scheduler.settings.lanes[Lane.BACKGROUND].max_prompt_tokens

    @property
    def max_output_tokens(self) -> int:
        """The most output tokens a job may ask for (the background lane's limit)."""
        return self._scheduler.settings.lanes[Lane.BACKGROUND].max_output_tokens

    @property
    def default_output_tokens(self) -> int:
        """The output tokens a job asks for when it names no limit (the background lane's)."""
        return self._scheduler.settings.lanes[Lane.BACKGROUND].default_output_tokens

    @property
    def paused(self) -> bool:
        """Whether no new job may start (running ones finish)."""
        return self._paused

    @callback
    def set_paused(self, paused: bool) -> None:
        """Pause or resume the jobs (the switch)."""
        self._paused = paused
        self._save()
        self._changed()
        self._schedule_pump()

    def jobs(self) -> list[Job]:
        """Every known job, oldest first."""
        return sorted(self._jobs.values(), key=lambda job: job.created_at)

    def has_job(self, job_id: str) -> bool:
        """Whether this entry holds a job with this id."""
        return job_id in self._jobs

    def get(self, job_id: str) -> Job:
        """One job by id (a translated validation error when there is none)."""
        try:
            return self._jobs[job_id]
        except KeyError:
            raise validation_error("job_not_found", job_id=job_id) from None

    @property
    def waiting_count(self) -> int:
        """Queued jobs."""
        return sum(job.status is JobStatus.QUEUED for job in self._jobs.values())

    def waiting_because(self) -> dict[str, int]:
        """How many unfinished jobs wait for each reason."""
        return dict(
            Counter(
                job.wait_reason.value
                for job in self._jobs.values()
                if job.wait_reason is not None and not job.status.finished
            )
        )

    @property
    def running_count(self) -> int:
        """Jobs streaming now."""
        return len(self._running)

    @property
    def done_tonight(self) -> int:
        """Jobs finished since the window last opened."""
        self._roll_night()
        return self._ledger.jobs_done

    @property
    def tokens_tonight(self) -> int:
        """Tokens jobs used since the window last opened."""
        self._roll_night()
        return self._ledger.tokens

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
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    @callback
    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    # --- actions ------------------------------------------------------------------------------

    @callback
    def check_room(self) -> None:
        """Refuse a new job while ``MAX_WAITING_JOBS`` wait (a translated validation error)."""
        waiting = sum(not job.status.finished for job in self._jobs.values())
        if waiting >= MAX_WAITING_JOBS:
            raise validation_error("too_many_jobs", maximum=str(MAX_WAITING_JOBS))

    async def async_submit(self, spec: JobSpec) -> Job:
        """Queue a new job and look at the queue at once (it may start now)."""
        self.check_room()
        job = Job.from_spec(uuid4().hex, spec, dt_util.utcnow())
        self._jobs[job.id] = job
        LOGGER.debug("Job %s queued (requester %s)", job.id, job.requester)
        await self._store.async_save(self._as_store_data())
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
            self._running.pop(running.job.id, None)
            if running.cancelled_by_user:
                self._finish(running.job, JobStatus.CANCELLED)
            else:
                self._interrupt(running.job)

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
        waiter = _Waiter(self.hass.loop.create_future(), answer_long_waits)
        self._waiters.setdefault(job_id, []).append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            return job
        finally:
            waiters = self._waiters.get(job_id, [])
            if waiter in waiters:
                waiters.remove(waiter)

    # --- deciding what runs ------------------------------------------------------------------

    def _now_ts(self) -> float:
        return dt_util.utcnow().timestamp()

    def _roll_night(self) -> None:
        if self._ledger.roll(self._settings.night_start(dt_util.now()).isoformat()):
            self._save()

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
    def _shared_wait_reason(self) -> WaitReason | None:
        """Why no job at all may start now (None: one may)."""
        if self._paused:
            return WaitReason.PAUSED
        if not self._reachable():
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
        queued = sorted(
            (job for job in self._jobs.values() if job.status is JobStatus.QUEUED),
            key=lambda job: (not job.run_now, job.created_at),
        )
        shared = self._shared_wait_reason()
        for job in queued:
            reason = (
                own_wait_reason(
                    job, now, window_open=window_open, budget_spent=budget_spent
                )
                or shared
            )
            if reason is None:
                self._start(job)
                shared = self._shared_wait_reason()
                changed = True
                continue
            if job.wait_reason is not reason:
                job.wait_reason = reason
                changed = True
                if reason.is_long:
                    self._answer_waiters(job, finished=False)
        if changed:
            self._save()
            self._changed()

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
            answer = await async_stream_answer(self._scheduler, job, self._model)
        except asyncio.CancelledError:
            running = self._running.pop(job.id, None)
            if running is not None and running.cancelled_by_user:
                self._finish(job, JobStatus.CANCELLED)
            else:
                # The entry unloads or Home Assistant stops.
                self._interrupt(job)
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
            await self._store.async_save(self._as_store_data())
            await async_deliver(self.hass, self.entry_id, job)
        self._pump()

    @callback
    def _interrupt(self, job: Job) -> None:
        """Put a job stopped by an unload back in the queue, to run again once after the next load."""
        job.interrupt()
        LOGGER.debug("Job %s interrupted; it runs again after the next start", job.id)
        self._save()

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
            self._answer_waiters(job, finished=False)
            self._save()
            self._changed()
            return
        LOGGER.warning(
            "Job %s failed after %s attempts: %s", job.id, job.attempts, job.last_error
        )
        self._finish(job, JobStatus.FAILED)

    @callback
    def _charge(self, tokens: int) -> None:
        self._roll_night()
        self._ledger.tokens += tokens
        self._bucket.spend(tokens, self._now_ts())

    @callback
    def _finish(self, job: Job, status: JobStatus) -> None:
        job.finish(status, dt_util.utcnow())
        if status is JobStatus.DONE:
            self._roll_night()
            self._ledger.jobs_done += 1
        self._answer_waiters(job)
        self._prune(job.finished_at or dt_util.utcnow())
        self._save()
        self._changed()

    @callback
    def _answer_waiters(self, job: Job, *, finished: bool = True) -> None:
        """Hand the job, as it is now, to the callers of ``async_wait`` waiting for this."""
        waiters = self._waiters.pop(job.id, [])
        for waiter in waiters:
            if (finished or waiter.answer_long_waits) and not waiter.future.done():
                waiter.future.set_result(job)
        if kept := [waiter for waiter in waiters if not waiter.future.done()]:
            self._waiters[job.id] = kept

    def _prune(self, now: datetime) -> None:
        """Forget finished jobs older than the retention period, and past ``MAX_FINISHED_JOBS``."""
        cutoff = now - timedelta(days=self._settings.retention_days)
        # Oldest first (the store keeps jobs in the order they came).
        finished = sorted(
            (job for job in self._jobs.values() if job.status.finished),
            key=lambda job: job.finished_at or job.created_at,
        )
        excess = len(finished) - MAX_FINISHED_JOBS
        old = [
            job.id
            for index, job in enumerate(finished)
            if index < excess
            or (job.finished_at is not None and job.finished_at < cutoff)
        ]
        for job_id in old:
            del self._jobs[job_id]
        if old:
            self._save()
            self._changed()
