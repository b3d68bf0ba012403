"""The jobs of one config entry as they are kept: in memory, in their store, and for how long.

``JobQueue`` holds every job the entry knows (queued, running and finished), the night's ledger
and whether jobs are paused, and writes them to the entry's ``JobStore``. It bounds what it keeps:
at most ``MAX_WAITING_JOBS`` unfinished jobs (one more is refused before anything is stored) and
``MAX_FINISHED_JOBS`` finished ones within the retention period, so the store stays small whatever
callers send. It decides nothing about running them; the ``JobManager`` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta

from homeassistant.core import HomeAssistant, callback

from custom_components.llm_lanes.error_translation import validation_error
from custom_components.llm_lanes.jobs.model import Job, JobStatus
from custom_components.llm_lanes.jobs.store import SAVE_DELAY_S, JobStore, JobStoreData
from custom_components.llm_lanes.jobs.throttles import NightLedger

MAX_WAITING_JOBS = 50
"""Queued and running jobs of one server; one more is refused before anything is stored."""
MAX_FINISHED_JOBS = 100
"""Finished jobs kept (within the retention period); the oldest are forgotten first."""


class JobQueue:
    """Every job of one config entry, the night's ledger and the pause, kept in the entry's store."""

    def __init__(self, hass: HomeAssistant, entry_id: str) -> None:
        """Start empty; ``async_load`` reads what the store holds."""
        self._store = JobStore(hass, entry_id)
        self._jobs: dict[str, Job] = {}
        self.ledger = NightLedger()
        self.paused = False

    # --- the store ------------------------------------------------------------------------------

    async def async_load(self) -> None:
        """Read the stored jobs; a job the last run left running goes back to the queue."""
        stored = await self._store.async_load()
        if stored is None:
            return
        for raw in stored["jobs"]:
            job = Job.from_stored(raw)
            if job.status is JobStatus.RUNNING:
                # The last run stopped without saying how it ended (a crash, or a stop that
                # could not write): it has not finished, so it runs again.
                job.interrupt()
            self._jobs[job.id] = job
        self.ledger = NightLedger.from_stored(stored["ledger"])
        self.paused = stored["paused"]

    async def async_save(self) -> None:
        """Write everything now (a new job, a finished one, the manager's start and stop)."""
        await self._store.async_save(self._as_store_data())

    @callback
    def save(self) -> None:
        """Write everything shortly, once routine changes have settled."""
        self._store.async_delay_save(self._as_store_data, SAVE_DELAY_S)

    def _as_store_data(self) -> JobStoreData:
        return {
            "jobs": [job.as_stored() for job in self._jobs.values()],
            "ledger": self.ledger.as_stored(),
            "paused": self.paused,
        }

    # --- the jobs -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Job]:
        """Every job, in the order they came."""
        return iter(self._jobs.values())

    def __contains__(self, job_id: object) -> bool:
        """Whether a job with this id is kept."""
        return job_id in self._jobs

    def get(self, job_id: str) -> Job:
        """One job by id (a translated validation error when there is none)."""
        try:
            return self._jobs[job_id]
        except KeyError:
            raise validation_error("job_not_found", job_id=job_id) from None

    @callback
    def check_room(self) -> None:
        """Refuse a new job while ``MAX_WAITING_JOBS`` wait (a translated validation error)."""
        waiting = sum(not job.status.finished for job in self._jobs.values())
        if waiting >= MAX_WAITING_JOBS:
            raise validation_error("too_many_jobs", maximum=str(MAX_WAITING_JOBS))

    def add(self, job: Job) -> None:
        """Keep a new job (``check_room`` first)."""
        self._jobs[job.id] = job

    def queued(self) -> list[Job]:
        """Return the queued jobs in the order they may start: those asked to run now first."""
        return sorted(
            (job for job in self._jobs.values() if job.status is JobStatus.QUEUED),
            key=lambda job: (not job.run_now, job.created_at),
        )

    def waiting_because(self) -> dict[str, int]:
        """How many unfinished jobs wait for each reason."""
        return dict(
            Counter(
                job.wait_reason.value
                for job in self._jobs.values()
                if job.wait_reason is not None and not job.status.finished
            )
        )

    def prune(self, now: datetime, retention_days: int) -> bool:
        """Forget finished jobs older than the retention period, and past ``MAX_FINISHED_JOBS``.

        Returns whether any job was forgotten.
        """
        cutoff = now - timedelta(days=retention_days)
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
        return bool(old)
