"""A summarization job's record, and where jobs live between restarts: a versioned ``Store``.

The stored document holds the jobs as plain dictionaries (``Job.as_stored`` / ``Job.from_stored``),
the night's token ledger and whether jobs are paused. Migrations bring older documents up to date:

- 1.1: jobs had ``state`` (no ``attempts``, ``last_error`` or ``interrupted``); no ledger, no pause.
- 1.2: jobs have ``status``, ``attempts``, ``last_error`` and ``interrupted``; the document has
  ``ledger`` (``night``, ``tokens``, ``jobs_done``) and ``paused``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypedDict

from homeassistant.core import HomeAssistant
from homeassistant.helpers.storage import Store
import homeassistant.util.dt as dt_util

from .const import DOMAIN

STORAGE_VERSION = 1
STORAGE_MINOR_VERSION = 2
SAVE_DELAY_S = 1.0
"""Routine changes are written this long after the last one; a new job, a finished job and
the manager's start and stop are written at once."""


class JobStatus(StrEnum):
    """Where a job is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Whether the job will never run again."""
        return self in {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED}


class WaitReason(StrEnum):
    """Why a queued job is not running."""

    OUTSIDE_WINDOW = "outside_window"
    BUDGET_SPENT = "budget_spent"
    """The night's token budget is spent; the job waits for the next night."""
    PAUSED = "paused"
    HOUSE_BUSY = "house_busy"
    """Voice or interactive requests are queued, streaming or missing their objectives."""
    IN_FLIGHT_LIMIT = "in_flight_limit"
    RATE_LIMIT = "rate_limit"
    RETRY_BACKOFF = "retry_backoff"


@dataclass(slots=True, kw_only=True)
class Job:
    """One summarization job (stored as a plain dict)."""

    id: str
    name: str | None
    requester: str
    created_at: datetime
    system_prompt: str
    prompt: str
    prompt_note: str | None
    prompt_tokens_estimate: int
    max_output_tokens: int | None
    run_now: bool = False
    notify_target: str | None = None
    persistent_notification: bool = False
    status: JobStatus = JobStatus.QUEUED
    attempts: int = 0
    """How many times the job was started."""
    interrupted: bool = False
    """Stopped mid-stream by an unload; it runs again (once) after the next load."""
    last_error: str | None = None
    wait_reason: WaitReason | None = None
    not_before: datetime | None = None
    """Retry back-off: the job does not start before this time."""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    text: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    token_source: str | None = None
    ttft_s: float | None = None

    @property
    def title(self) -> str:
        """What the notification is titled."""
        return self.name or f"Summary {self.id[:8]}"

    def as_stored(self) -> dict[str, Any]:
        """Return the job as the store keeps it (JSON-safe)."""
        return {
            "id": self.id,
            "name": self.name,
            "requester": self.requester,
            "created_at": self.created_at.isoformat(),
            "system_prompt": self.system_prompt,
            "prompt": self.prompt,
            "prompt_note": self.prompt_note,
            "prompt_tokens_estimate": self.prompt_tokens_estimate,
            "max_output_tokens": self.max_output_tokens,
            "run_now": self.run_now,
            "notify_target": self.notify_target,
            "persistent_notification": self.persistent_notification,
            "status": self.status.value,
            "attempts": self.attempts,
            "interrupted": self.interrupted,
            "last_error": self.last_error,
            "wait_reason": self.wait_reason.value if self.wait_reason else None,
            "not_before": iso_or_none(self.not_before),
            "started_at": iso_or_none(self.started_at),
            "finished_at": iso_or_none(self.finished_at),
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "token_source": self.token_source,
            "ttft_s": self.ttft_s,
        }

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> Job:
        """Rebuild a job from the store."""
        return cls(
            id=data["id"],
            name=data.get("name"),
            requester=data["requester"],
            created_at=_parse_dt(data["created_at"]),
            system_prompt=data.get("system_prompt", ""),
            prompt=data["prompt"],
            prompt_note=data.get("prompt_note"),
            prompt_tokens_estimate=int(data.get("prompt_tokens_estimate", 0)),
            max_output_tokens=data.get("max_output_tokens"),
            run_now=bool(data.get("run_now", False)),
            notify_target=data.get("notify_target"),
            persistent_notification=bool(data.get("persistent_notification", False)),
            status=JobStatus(data["status"]),
            attempts=int(data.get("attempts", 0)),
            interrupted=bool(data.get("interrupted", False)),
            last_error=data.get("last_error"),
            wait_reason=WaitReason(data["wait_reason"])
            if data.get("wait_reason")
            else None,
            not_before=_parse_optional_dt(data.get("not_before")),
            started_at=_parse_optional_dt(data.get("started_at")),
            finished_at=_parse_optional_dt(data.get("finished_at")),
            text=data.get("text"),
            prompt_tokens=int(data.get("prompt_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            token_source=data.get("token_source"),
            ttft_s=data.get("ttft_s"),
        )

    def as_response(self) -> dict[str, Any]:
        """Return what ``list_jobs`` and ``summarize`` show: everything but the prompt text."""
        stored = self.as_stored()
        for private in ("system_prompt", "prompt"):
            stored.pop(private)
        stored["job_id"] = stored.pop("id")
        return stored


def iso_or_none(value: datetime | None) -> str | None:
    """Return the ISO form of a datetime, or None."""
    return value.isoformat() if value is not None else None


def _parse_dt(value: str) -> datetime:
    parsed = dt_util.parse_datetime(value)
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    return parsed


def _parse_optional_dt(value: str | None) -> datetime | None:
    return _parse_dt(value) if value else None


class LedgerData(TypedDict):
    """Tokens and jobs of the current night (the run window that opened last)."""

    night: str | None
    """ISO start of that window, in local time."""
    tokens: int
    jobs_done: int


class JobStoreData(TypedDict):
    """The whole stored document."""

    jobs: list[dict[str, Any]]
    ledger: LedgerData
    paused: bool


def empty_store_data() -> JobStoreData:
    """Return the document a new entry starts with."""
    return {
        "jobs": [],
        "ledger": {"night": None, "tokens": 0, "jobs_done": 0},
        "paused": False,
    }


def storage_key(entry_id: str) -> str:
    """One document per config entry (one LLM server)."""
    return f"{DOMAIN}.jobs.{entry_id}"


class JobStore(Store[JobStoreData]):
    """The jobs of one config entry, migrated to the current layout on load."""

    def __init__(self, hass: HomeAssistant, entry_id: str) -> None:
        """Bind the store to the entry's storage key."""
        super().__init__(
            hass,
            STORAGE_VERSION,
            storage_key(entry_id),
            minor_version=STORAGE_MINOR_VERSION,
            private=True,
            atomic_writes=True,
        )

    async def _async_migrate_func(
        self,
        old_major_version: int,
        old_minor_version: int,
        old_data: dict[str, Any],
    ) -> JobStoreData:
        """Bring a document written by an older version up to the current layout."""
        if old_major_version > STORAGE_VERSION:
            raise NotImplementedError(
                f"job store version {old_major_version} is newer than this integration"
            )
        return migrate_store_data(old_minor_version, old_data)


def migrate_store_data(
    old_minor_version: int, old_data: dict[str, Any]
) -> JobStoreData:
    """Migrate a version-1 document of any minor version to the current one."""
    data: dict[str, Any] = dict(old_data)
    if old_minor_version < 2:
        jobs: list[dict[str, Any]] = []
        for old_job in data.get("jobs", []):
            job = dict(old_job)
            job["status"] = job.pop("state", job.get("status", "queued"))
            job.setdefault("attempts", 0)
            job.setdefault("last_error", None)
            job.setdefault("interrupted", False)
            jobs.append(job)
        data["jobs"] = jobs
        data.setdefault("ledger", {"night": None, "tokens": 0, "jobs_done": 0})
        data.setdefault("paused", False)
    return {
        "jobs": list(data.get("jobs", [])),
        "ledger": data["ledger"],
        "paused": bool(data.get("paused", False)),
    }
