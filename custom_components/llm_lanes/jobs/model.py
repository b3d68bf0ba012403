"""A summarization job: what was asked, where it is in its life, and why it waits.

The store keeps a job as a plain dictionary (``Job.as_stored`` / ``Job.from_stored``); the actions
show it without its prompt text (``Job.as_response``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from enum import StrEnum
from types import NoneType, UnionType
from typing import Any, get_args, get_type_hints

import homeassistant.util.dt as dt_util

from custom_components.llm_lanes.jobs.prompts import JobPrompt
from custom_components.llm_lanes.requesters import job_requester


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
    SERVER_UNREACHABLE = "server_unreachable"
    """The server's last poll (or a request) failed; the job starts once it answers again."""

    @property
    def is_long(self) -> bool:
        """Whether the wait may last long: a caller waiting for the job is answered at once."""
        return self in LONG_WAITS


LONG_WAITS: frozenset[WaitReason] = frozenset(
    {
        WaitReason.OUTSIDE_WINDOW,
        WaitReason.BUDGET_SPENT,
        WaitReason.PAUSED,
        WaitReason.RETRY_BACKOFF,
        WaitReason.SERVER_UNREACHABLE,
    }
)
"""Waits measured in minutes or hours, or with no end in sight (a busy house passes soon)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What the ``summarize`` action asks for, once the prompt is built."""

    prompt: JobPrompt
    name: str | None = None
    requester: str | None = None
    """Who is charged; ``job:<name>`` (or ``job``) when not given."""
    user_id: str | None = None
    """The Home Assistant user who asked (who may list and cancel it besides admins)."""
    max_output_tokens: int | None = None
    run_now: bool = False
    notify_target: str | None = None
    persistent_notification: bool = False
    pool: bool = False
    """Run on whichever server of the household's pool serves the background lane."""


@dataclass(slots=True)
class JobAnswer:
    """What one run brought back."""

    text: str
    prompt_tokens: int
    """As the server counted them (0 when it did not say)."""
    output_tokens: int
    token_source: str | None
    ttft_s: float | None


@dataclass(slots=True, kw_only=True)
class Job:
    """One summarization job (stored as a plain dict)."""

    id: str
    name: str | None
    requester: str
    created_at: datetime
    user_id: str | None = None
    system_prompt: str
    prompt: str
    prompt_note: str | None
    prompt_tokens_estimate: int
    max_output_tokens: int | None
    run_now: bool = False
    notify_target: str | None = None
    persistent_notification: bool = False
    pool: bool = False
    """It runs wherever the household's pool sends background work, not on its server alone."""
    status: JobStatus = JobStatus.QUEUED
    attempts: int = 0
    """How many times the job was started (an interrupted start is given back)."""
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

    @classmethod
    def from_spec(cls, job_id: str, spec: JobSpec, created_at: datetime) -> Job:
        """Make a new queued job of what the action asked for."""
        return cls(
            id=job_id,
            name=spec.name,
            requester=spec.requester or job_requester(spec.name),
            created_at=created_at,
            user_id=spec.user_id,
            system_prompt=spec.prompt.system,
            prompt=spec.prompt.user,
            prompt_note=spec.prompt.note,
            prompt_tokens_estimate=spec.prompt.tokens_estimate,
            max_output_tokens=spec.max_output_tokens,
            run_now=spec.run_now,
            notify_target=spec.notify_target,
            persistent_notification=spec.persistent_notification,
            pool=spec.pool,
        )

    def start(self, now: datetime) -> None:
        """Begin another attempt."""
        self.status = JobStatus.RUNNING
        self.attempts += 1
        self.wait_reason = None
        self.not_before = None
        self.started_at = now

    def interrupt(self) -> None:
        """Go back to the queue after an unload, a restart or a crash stopped the run.

        The run did not fail, so its attempt is given back: restarts never use up the retries.
        """
        self.status = JobStatus.QUEUED
        self.interrupted = True
        self.started_at = None
        self.attempts = max(0, self.attempts - 1)

    def record(self, answer: JobAnswer) -> None:
        """Keep what the run brought back (the estimate stands in for a count the server did not give)."""
        self.text = answer.text
        self.prompt_tokens = answer.prompt_tokens or self.prompt_tokens_estimate
        self.output_tokens = answer.output_tokens
        self.token_source = answer.token_source or "estimate"
        self.ttft_s = answer.ttft_s
        self.last_error = None

    def finish(self, status: JobStatus, now: datetime) -> None:
        """End the job for good: done, failed or cancelled; its prompt is no longer kept."""
        self.status = status
        self.finished_at = now
        self.wait_reason = None
        self.not_before = None
        self.system_prompt = self.prompt = ""

    @property
    def waits_long(self) -> bool:
        """Whether it is queued for something that takes long (see ``WaitReason.is_long``)."""
        return (
            self.status is JobStatus.QUEUED
            and self.wait_reason is not None
            and self.wait_reason.is_long
        )

    @property
    def title(self) -> str:
        """What the notification is titled."""
        return self.name or f"Summary {self.id[:8]}"

    @property
    def wait_s(self) -> float | None:
        """How long the job was queued before its (last) start."""
        if self.started_at is None:
            return None
        return (self.started_at - self.created_at).total_seconds()

    @property
    def duration_s(self) -> float | None:
        """How long its last run took."""
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    def as_stored(self) -> dict[str, Any]:
        """Return the job as the store keeps it (JSON-safe: times in ISO form, enums by value)."""
        return {
            field.name: _stored(getattr(self, field.name)) for field in fields(self)
        }

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> Job:
        """Rebuild a job from what ``as_stored`` wrote: each field read back by its type.

        A field a job stored before it existed takes its default.
        """
        hints = get_type_hints(cls)
        return cls(
            **{
                field.name: _restored(hints[field.name], data[field.name])
                for field in fields(cls)
                if field.name in data or field.default is MISSING
            }
        )

    def as_response(self) -> dict[str, Any]:
        """Return what ``list_jobs`` and ``summarize`` show: everything but the prompt text."""
        stored = self.as_stored()
        for private in ("system_prompt", "prompt"):
            stored.pop(private)
        stored["job_id"] = stored.pop("id")
        return stored


def _stored(value: Any) -> Any:
    """Make a field's value JSON-safe (``_restored`` reads it back)."""
    if isinstance(value, datetime):
        return value.isoformat()
    return value.value if isinstance(value, StrEnum) else value


def _restored(hint: Any, value: Any) -> Any:
    """Read back what ``_stored`` wrote of a field whose type is ``hint``."""
    if value is None:
        return None
    if isinstance(hint, UnionType):  # a type or None: the value is not None here
        (hint,) = set(get_args(hint)) - {NoneType}
    if hint is datetime:
        return _parse_dt(value)
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return hint(value)
    return value


def iso_or_none(value: datetime | None) -> str | None:
    """Return the ISO form of a datetime, or None."""
    return value.isoformat() if value is not None else None


def _parse_dt(value: str) -> datetime:
    parsed = dt_util.parse_datetime(value)
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    return parsed
