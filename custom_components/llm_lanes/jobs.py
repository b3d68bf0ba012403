"""Nightly summarization jobs: queued, persisted, windowed and throttled.

A job is a background-lane request that may wait hours for its turn. The ``JobManager`` of a
config entry keeps the jobs in a ``JobStore`` and starts one only when every throttle allows it:

- the run window is open (default 01:00-06:00 local time) and the night's token budget is not
  spent (it resets when the next window opens); a job asked to run now skips these two;
- fewer than ``max_in_flight`` jobs run, the token bucket (tokens per minute) is not in debt,
  jobs are not paused, and the house is quiet: no voice or interactive request is queued or
  streaming, and those lanes' goodput over the scheduler's window meets the objective.

Once started, a job is the scheduler's business like any other background request (it may be
preempted for voice and resumed). Server errors retry with exponential back-off up to
``max_attempts``. A job that is streaming when the entry unloads goes back to the queue marked
``interrupted`` and runs again, once, after the next load; finished jobs never run again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, time, timedelta
from typing import Any, Protocol
from uuid import uuid4

from homeassistant.components import persistent_notification
from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers.event import async_track_time_interval
import homeassistant.util.dt as dt_util
import probatio

from .const import (
    DEFAULT_NIGHTLY_END,
    DEFAULT_NIGHTLY_START,
    DOMAIN,
    LOGGER,
    OPT_NIGHTLY_END,
    OPT_NIGHTLY_START,
)
from .core.backends.base import ChatMessage, ChatRequest, StreamChunk
from .core.errors import (
    AuthError,
    LanesError,
    LimitExceededError,
    ModelNotFoundError,
    QuotaExceededError,
    SchedulerClosedError,
    ToolsUnsupportedError,
)
from .core.lanes import Lane
from .core.settings import SchedulerSettings
from .core.snapshot import FinishedRequest, SchedulerSnapshot
from .job_history import JobPrompt
from .job_store import (
    SAVE_DELAY_S,
    Job,
    JobStatus,
    JobStore,
    JobStoreData,
    LedgerData,
    WaitReason,
    iso_or_none,
)

EVENT_SUMMARY_READY = "llm_lanes_summary_ready"

OPT_JOBS_MAX_IN_FLIGHT = "jobs_max_in_flight"
OPT_JOBS_TOKENS_PER_MINUTE = "jobs_tokens_per_minute"
"""0 means no rate limit."""
OPT_JOBS_NIGHTLY_BUDGET = "jobs_nightly_token_budget"
"""0 means no budget."""
OPT_JOBS_RETENTION_DAYS = "jobs_retention_days"

TICK_INTERVAL = timedelta(seconds=10)
"""How often waiting jobs are looked at again (window, bucket, back-off, retries, retention)."""
QUIET_LANES = (Lane.VOICE, Lane.INTERACTIVE)
NON_RETRYABLE_ERRORS: tuple[type[LanesError], ...] = (
    LimitExceededError,
    QuotaExceededError,
    ModelNotFoundError,
    AuthError,
    ToolsUnsupportedError,
)
"""Errors that another attempt would meet again."""


class JobScheduler(Protocol):
    """What jobs need of the scheduler (``core.scheduler.Scheduler`` provides it)."""

    @property
    def settings(self) -> SchedulerSettings:
        """The scheduler's current settings (lane limits)."""

    def snapshot(self) -> SchedulerSnapshot:
        """Return the scheduler's state now."""

    def stream(
        self,
        chat_request: ChatRequest,
        *,
        lane: Lane,
        requester: str,
        prompt_tokens: int | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """Stream an answer through the scheduler."""

    def add_listener(
        self, callback: Callable[[FinishedRequest], None]
    ) -> Callable[[], None]:
        """Be told of every finished request."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSettings:
    """The throttles of the job system (options flow)."""

    window_start: time = time(1, 0)
    window_end: time = time(6, 0)
    """Equal start and end mean the window never closes."""
    max_in_flight: int = 1
    tokens_per_minute: int = 0
    nightly_token_budget: int = 0
    retention_days: int = 7
    max_attempts: int = 3
    retry_base_s: float = 60.0
    """The first retry waits this long; each further one twice as long (at most an hour)."""
    goodput_objective: float = 0.9
    """Jobs hold back while voice or interactive goodput over the window is below this."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> JobSettings:
        """Read the job throttles from a config entry's options (defaults where unset)."""
        return cls(
            window_start=_parse_time(
                options.get(OPT_NIGHTLY_START, DEFAULT_NIGHTLY_START)
            ),
            window_end=_parse_time(options.get(OPT_NIGHTLY_END, DEFAULT_NIGHTLY_END)),
            max_in_flight=max(1, int(options.get(OPT_JOBS_MAX_IN_FLIGHT, 1))),
            tokens_per_minute=max(0, int(options.get(OPT_JOBS_TOKENS_PER_MINUTE, 0))),
            nightly_token_budget=max(0, int(options.get(OPT_JOBS_NIGHTLY_BUDGET, 0))),
            retention_days=max(1, int(options.get(OPT_JOBS_RETENTION_DAYS, 7))),
        )

    def in_window(self, local: datetime) -> bool:
        """Whether the run window is open at this local time."""
        start, end, now = self.window_start, self.window_end, local.time()
        if start == end:
            return True
        if start < end:
            return start <= now < end
        return now >= start or now < end

    def night_start(self, local: datetime) -> datetime:
        """When the window that opened last (at or before ``local``) opened: the current night."""
        opened = local.replace(
            hour=self.window_start.hour,
            minute=self.window_start.minute,
            second=self.window_start.second,
            microsecond=0,
        )
        return opened if opened <= local else opened - timedelta(days=1)

    def retry_delay(self, attempts: int) -> timedelta:
        """How long a job waits before attempt number ``attempts + 1``."""
        return timedelta(
            seconds=min(3600.0, self.retry_base_s * 2 ** max(0, attempts - 1))
        )


def _parse_time(value: str | time) -> time:
    return value if isinstance(value, time) else time.fromisoformat(value)


class TokenBucket:
    """Tokens per minute, charged after the fact: a job starts only while the bucket is not in debt.

    The cost of a job is known only once it finished, so its tokens are taken then, possibly
    driving the level below zero; the next job waits until the refill pays the debt back.
    """

    def __init__(self, tokens_per_minute: int, now: float) -> None:
        """Start full."""
        self._rate = tokens_per_minute
        self._level = float(tokens_per_minute)
        self._at = now

    def set_rate(self, tokens_per_minute: int, now: float) -> None:
        """Change the rate (0 disables the limit)."""
        self._refill(now)
        self._rate = tokens_per_minute
        self._level = min(self._level, float(tokens_per_minute))

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._level = min(
                float(self._rate), self._level + (now - self._at) * self._rate / 60.0
            )
        self._at = now

    def allows_start(self, now: float) -> bool:
        """Whether a job may start now."""
        if self._rate <= 0:
            return True
        self._refill(now)
        return self._level > 0

    def spend(self, tokens: int, now: float) -> None:
        """Charge the tokens a job used."""
        self._refill(now)
        self._level -= tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What the ``summarize`` action asks for, once the prompt is built."""

    prompt: JobPrompt
    name: str | None = None
    requester: str | None = None
    """Who is charged; ``job:<name or id>`` when not given."""
    max_output_tokens: int | None = None
    run_now: bool = False
    notify_target: str | None = None
    persistent_notification: bool = False


class JobNotFoundError(HomeAssistantError):
    """No job has this id."""


class JobFinishedError(HomeAssistantError):
    """The job already finished; it cannot be cancelled."""


@dataclass(slots=True)
class _Running:
    job: Job
    task: asyncio.Task[None]
    cancelled_by_user: bool = False


@dataclass(slots=True)
class _Counters:
    """The night's ledger, kept in the store."""

    night: str | None = None
    tokens: int = 0
    jobs_done: int = 0

    def as_stored(self) -> LedgerData:
        return {"night": self.night, "tokens": self.tokens, "jobs_done": self.jobs_done}


class JobManager:
    """The queue, throttles, runs and deliveries of one config entry's jobs."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry_id: str,
        scheduler: JobScheduler,
        *,
        model: str,
        settings: JobSettings | None = None,
    ) -> None:
        """Create the manager; nothing runs before ``async_start``."""
        self.hass = hass
        self.entry_id = entry_id
        self._scheduler = scheduler
        self._model = model
        self._settings = settings or JobSettings()
        self._store = JobStore(hass, entry_id)
        self._jobs: dict[str, Job] = {}
        self._running: dict[str, _Running] = {}
        self._ledger = _Counters()
        self._paused = False
        self._bucket = TokenBucket(self._settings.tokens_per_minute, self._now_ts())
        self._listeners: list[Callable[[], None]] = []
        self._waiters: dict[str, list[asyncio.Future[Job]]] = {}
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
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.cancel()
        self._waiters.clear()
        await self._store.async_save(self._as_store_data())

    def _restore(self, stored: JobStoreData) -> None:
        for raw in stored["jobs"]:
            job = Job.from_stored(raw)
            if job.status is JobStatus.RUNNING:
                # The last run stopped without saying how it ended (a crash, or a stop that
                # could not write): it has not finished, so it runs again.
                job.status = JobStatus.QUEUED
                job.interrupted = True
            self._jobs[job.id] = job
        ledger = stored["ledger"]
        self._ledger = _Counters(ledger["night"], ledger["tokens"], ledger["jobs_done"])
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

    def get(self, job_id: str) -> Job:
        """One job by id."""
        try:
            return self._jobs[job_id]
        except KeyError:
            raise JobNotFoundError(f"no job {job_id}") from None

    @property
    def waiting_count(self) -> int:
        """Queued jobs."""
        return sum(job.status is JobStatus.QUEUED for job in self._jobs.values())

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
        budget = self._settings.nightly_token_budget
        return budget > 0 and self.tokens_tonight >= budget

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

    async def async_submit(self, spec: JobSpec) -> Job:
        """Queue a new job and look at the queue at once (it may start now)."""
        job_id = uuid4().hex
        job = Job(
            id=job_id,
            name=spec.name,
            requester=spec.requester or f"job:{spec.name or job_id}",
            created_at=dt_util.utcnow(),
            system_prompt=spec.prompt.system,
            prompt=spec.prompt.user,
            prompt_note=spec.prompt.note,
            prompt_tokens_estimate=spec.prompt.tokens_estimate,
            max_output_tokens=spec.max_output_tokens,
            run_now=spec.run_now,
            notify_target=spec.notify_target,
            persistent_notification=spec.persistent_notification,
        )
        self._jobs[job_id] = job
        LOGGER.debug("Job %s queued (requester %s)", job_id, job.requester)
        await self._store.async_save(self._as_store_data())
        self._pump()
        return job

    async def async_cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job."""
        job = self.get(job_id)
        if job.status.finished:
            raise JobFinishedError(f"job {job_id} already {job.status}")
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

    async def async_wait(self, job_id: str, timeout: float) -> Job:
        """Wait until the job finished, or ``timeout`` seconds; return it as it is then."""
        job = self.get(job_id)
        if job.status.finished:
            return job
        future: asyncio.Future[Job] = self.hass.loop.create_future()
        self._waiters.setdefault(job_id, []).append(future)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            return job
        finally:
            futures = self._waiters.get(job_id, [])
            if future in futures:
                futures.remove(future)

    # --- deciding what runs ------------------------------------------------------------------

    def _now_ts(self) -> float:
        return dt_util.utcnow().timestamp()

    def _roll_night(self) -> None:
        night = self._settings.night_start(dt_util.now()).isoformat()
        if self._ledger.night != night:
            self._ledger = _Counters(night=night)
            self._save()

    def _house_busy(self, snapshot: SchedulerSnapshot) -> bool:
        for lane in QUIET_LANES:
            state = snapshot.lanes.get(lane)
            if state is None:
                continue
            if state.queue_depth > 0 or state.in_flight > 0:
                return True
            if (
                state.goodput is not None
                and state.goodput < self._settings.goodput_objective
            ):
                return True
        return False

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
        if len(self._running) >= self._settings.max_in_flight:
            return WaitReason.IN_FLIGHT_LIMIT
        if self._house_busy(self._scheduler.snapshot()):
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
            reason: WaitReason | None
            if job.not_before is not None and job.not_before > now:
                reason = WaitReason.RETRY_BACKOFF
            elif not job.run_now and not window_open:
                reason = WaitReason.OUTSIDE_WINDOW
            elif not job.run_now and budget_spent:
                reason = WaitReason.BUDGET_SPENT
            else:
                reason = shared
            if reason is None:
                self._start(job)
                shared = self._shared_wait_reason()
                changed = True
                continue
            if job.wait_reason is not reason:
                job.wait_reason = reason
                changed = True
        if changed:
            self._save()
            self._changed()

    @callback
    def _start(self, job: Job) -> None:
        job.status = JobStatus.RUNNING
        job.attempts += 1
        job.wait_reason = None
        job.not_before = None
        job.started_at = dt_util.utcnow()
        LOGGER.debug("Job %s starts (attempt %s)", job.id, job.attempts)
        task = self.hass.async_create_background_task(
            self._async_run(job), f"{DOMAIN} job {job.id}", eager_start=False
        )
        self._running[job.id] = _Running(job, task)

    # --- running one job ------------------------------------------------------------------------

    async def _async_run(self, job: Job) -> None:
        request = ChatRequest(
            model=self._model,
            messages=(
                ChatMessage(role="system", content=job.system_prompt),
                ChatMessage(role="user", content=job.prompt),
            ),
            max_tokens=job.max_output_tokens,
        )
        parts: list[str] = []
        usage_prompt = usage_output = 0
        token_source: str | None = None
        first_token_at: datetime | None = None
        started = dt_util.utcnow()
        try:
            stream = self._scheduler.stream(
                request,
                lane=Lane.BACKGROUND,
                requester=job.requester,
                prompt_tokens=job.prompt_tokens_estimate,
            )
            try:
                async for chunk in stream:
                    if chunk.text:
                        if first_token_at is None:
                            first_token_at = dt_util.utcnow()
                        parts.append(chunk.text)
                        usage_output += chunk.output_tokens
                    if chunk.usage is not None:
                        usage_prompt = chunk.usage.prompt_tokens
                        usage_output = chunk.usage.output_tokens
                        token_source = chunk.usage.source
            finally:
                # Closing the stream cancels the request at the server and frees its slot.
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
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
            job.text = "".join(parts)
            job.prompt_tokens = usage_prompt or job.prompt_tokens_estimate
            job.output_tokens = usage_output
            job.token_source = token_source or "estimate"
            job.ttft_s = (
                (first_token_at - started).total_seconds() if first_token_at else None
            )
            job.last_error = None
            self._charge(job.prompt_tokens + job.output_tokens)
            self._finish(job, JobStatus.DONE)
            # Written before delivery, so that a crash from here on never runs the job again.
            await self._store.async_save(self._as_store_data())
            await self._async_deliver(job)
        self._pump()

    @callback
    def _interrupt(self, job: Job) -> None:
        """Put a job stopped by an unload back in the queue, to run again once after the next load."""
        job.status = JobStatus.QUEUED
        job.interrupted = True
        job.started_at = None
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
        job.status = status
        job.finished_at = dt_util.utcnow()
        job.wait_reason = None
        job.not_before = None
        if status is JobStatus.DONE:
            self._roll_night()
            self._ledger.jobs_done += 1
        for future in self._waiters.pop(job.id, []):
            if not future.done():
                future.set_result(job)
        self._save()
        self._changed()

    def _prune(self, now: datetime) -> None:
        """Forget finished jobs older than the retention period."""
        cutoff = now - timedelta(days=self._settings.retention_days)
        old = [
            job.id
            for job in self._jobs.values()
            if job.status.finished
            and job.finished_at is not None
            and job.finished_at < cutoff
        ]
        for job_id in old:
            del self._jobs[job_id]
        if old:
            self._save()
            self._changed()

    # --- delivery ---------------------------------------------------------------------------------

    async def _async_deliver(self, job: Job) -> None:
        """Fire the event; send the notification and the persistent notification if asked."""
        text = job.text or ""
        wait_s = (
            (job.started_at - job.created_at).total_seconds()
            if job.started_at
            else None
        )
        duration_s = (
            (job.finished_at - job.started_at).total_seconds()
            if job.finished_at and job.started_at
            else None
        )
        self.hass.bus.async_fire(
            EVENT_SUMMARY_READY,
            {
                "entry_id": self.entry_id,
                "job_id": job.id,
                "name": job.name,
                "requester": job.requester,
                "text": text,
                "prompt_tokens": job.prompt_tokens,
                "output_tokens": job.output_tokens,
                "token_source": job.token_source,
                "created_at": iso_or_none(job.created_at),
                "started_at": iso_or_none(job.started_at),
                "finished_at": iso_or_none(job.finished_at),
                "wait_s": wait_s,
                "duration_s": duration_s,
                "ttft_s": job.ttft_s,
                "attempts": job.attempts,
                "prompt_note": job.prompt_note,
            },
        )
        if job.notify_target:
            try:
                await async_send_notification(
                    self.hass, job.notify_target, job.title, text
                )
            except (HomeAssistantError, probatio.Invalid) as err:
                LOGGER.warning(
                    "Job %s: could not notify %s: %s", job.id, job.notify_target, err
                )
        if job.persistent_notification:
            persistent_notification.async_create(
                self.hass,
                text,
                title=job.title,
                notification_id=f"{DOMAIN}_job_{job.id}",
            )


def notify_target_exists(hass: HomeAssistant, target: str) -> bool:
    """Whether ``target`` is a notify entity or a (legacy) notify service."""
    if target.startswith("notify.") and hass.states.get(target) is not None:
        return True
    return hass.services.has_service("notify", target.removeprefix("notify."))


async def async_send_notification(
    hass: HomeAssistant, target: str, title: str, message: str
) -> None:
    """Send to a notify entity (``notify.send_message``) or a legacy notify service."""
    if target.startswith("notify.") and hass.states.get(target) is not None:
        await hass.services.async_call(
            "notify",
            "send_message",
            {"entity_id": target, "title": title, "message": message},
            blocking=True,
        )
        return
    service = target.removeprefix("notify.")
    if not hass.services.has_service("notify", service):
        raise HomeAssistantError(f"no notify entity or service {target}")
    await hass.services.async_call(
        "notify", service, {"title": title, "message": message}, blocking=True
    )


def with_options(settings: JobSettings, options: Mapping[str, Any]) -> JobSettings:
    """Return settings with the option-backed fields taken from ``options`` (others kept)."""
    from_options = JobSettings.from_options(options)
    return replace(
        settings,
        window_start=from_options.window_start,
        window_end=from_options.window_end,
        max_in_flight=from_options.max_in_flight,
        tokens_per_minute=from_options.tokens_per_minute,
        nightly_token_budget=from_options.nightly_token_budget,
        retention_days=from_options.retention_days,
    )
