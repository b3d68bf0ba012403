"""Immutable views of the scheduler's state and of finished requests, for entities and events.

These are the contract between the engine and the Home Assistant adapters: cheap to take, never
mutated after creation, free of prompt text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .backends.base import TokenUsage, ToolCall
from .lanes import Lane
from .settings import SchedulerSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishedRequest:
    """One request that left the scheduler (finished, failed or cancelled)."""

    request_id: str
    lane: Lane
    """The lane it ran in (after any quota demotion)."""
    requester: str
    outcome: str
    """"ok", "error", "cancelled" or "rejected"."""
    error: str | None
    """The error's class name when outcome is not "ok"."""
    queue_wait_s: float
    ttft_s: float | None
    """From arrival at the scheduler to the first output token."""
    itl_p95_s: float | None
    itl_max_s: float | None
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    token_source: str
    """"server" or "estimate"."""
    preemptions: int
    met_ttft: bool
    met_itl: bool

    @property
    def met_objectives(self) -> bool:
        """Whether it counts towards goodput."""
        return self.outcome == "ok" and self.met_ttft and self.met_itl


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneSnapshot:
    """One lane's state; percentiles are over the sliding window (None when it holds no sample)."""

    lane: Lane
    queue_depth: int
    in_flight: int
    finished_in_window: int
    finished_total: int
    rejected_total: int
    preemptions_total: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    queue_wait_p50_s: float | None
    queue_wait_p95_s: float | None
    goodput: float | None
    """Fraction 0..1 of the window's finished requests that met both objectives."""
    good_per_s: float
    prompt_tokens_total: int
    output_tokens_total: int
    itl_p90_s: float | None = None
    e2e_p90_s: float | None = None
    e2e_p99_s: float | None = None
    queue_wait_p90_s: float | None = None
    queue_wait_p99_s: float | None = None
    output_tok_s: float = 0.0
    """Output tokens per second of this lane over the window."""
    prompt_tok_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RequesterSnapshot:
    """Token use of one requester."""

    requester: str
    prompt_tokens_total: int
    output_tokens_total: int
    tokens_last_24h: int
    """What counts against the daily quota."""
    virtual_counter: float
    """Virtual Token Counter value (weighted service), for diagnostics."""
    quota_tokens: int = 0
    """Rolling 24 h budget (0 = unlimited)."""
    queue_depth: int = 0
    in_flight: int = 0
    finished_total: int = 0
    rejected_total: int = 0
    preemptions_total: int = 0
    finished_in_window: int = 0
    queue_wait_p50_s: float | None = None
    queue_wait_p95_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p95_s: float | None = None
    goodput: float | None = None
    output_tok_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSnapshot:
    """The whole scheduler at one instant."""

    taken_at: float
    settings: SchedulerSettings
    lanes: Mapping[Lane, LaneSnapshot]
    requesters: Mapping[str, RequesterSnapshot]
    queue_depth: int
    in_flight: int
    prompt_tokens_in_flight: int
    output_tok_s: float
    """Output tokens per second over the window."""
    prompt_tok_s: float
    goodput: float | None
    """Over all lanes in the window."""
    rejected_total: int
    preemptions_total: int
    window_s: float
    background_service_share: float | None = None
    """Background's fraction of the weighted service over the share window (None when idle)."""
    finished_total: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateResult:
    """A whole answer collected by ``Scheduler.generate``."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: TokenUsage
    finished: FinishedRequest
