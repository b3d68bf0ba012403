"""Immutable views of a scheduler's and a pool's state and of finished requests, for entities and events.

These are the contract between the engine and the Home Assistant adapters: cheap to take, never
mutated after creation, free of prompt text. ``build_snapshot`` takes one from the scheduler's
state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from custom_components.llm_lanes.core.availability import ServerState
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.metrics import GroupStats, StatsView
from custom_components.llm_lanes.core.model import TokenUsage, ToolCall
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.run_state import QueuedRequest, RunState
from custom_components.llm_lanes.core.settings import SchedulerSettings


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
    server: str | None = None
    """The server it ended on, where a pool routed it (None: one server's own scheduler)."""
    failovers: int = 0
    """How many times a pool moved it to another server after one failed."""
    resumed_on: str | None = None
    """The server that continued an answer another server had begun (None: it never did)."""
    path: tuple[str, ...] = ()
    """The servers its attempts went to, in order, where a pool routed it (the last is ``server``)."""

    @property
    def met_objectives(self) -> bool:
        """Whether it counts towards goodput."""
        return self.outcome == "ok" and self.met_ttft and self.met_itl


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSnapshot:
    """What lane and requester snapshots both show of their requests (see ``_group_fields``).

    Percentiles are over the sliding window (None when it holds no sample).
    """

    queue_depth: int
    in_flight: int
    finished_in_window: int
    finished_total: int
    rejected_total: int
    preemptions_total: int
    prompt_tokens_total: int
    output_tokens_total: int
    goodput: float | None
    """Fraction 0..1 of the window's finished requests that met both objectives."""
    output_tok_s: float
    """Output tokens per second over the window."""
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    queue_wait_p50_s: float | None
    queue_wait_p95_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneSnapshot(GroupSnapshot):
    """One lane's state, with its tails (p90, p99) and rates."""

    lane: Lane
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    itl_p90_s: float | None
    itl_p99_s: float | None
    e2e_p90_s: float | None
    e2e_p99_s: float | None
    queue_wait_p90_s: float | None
    queue_wait_p99_s: float | None
    good_per_s: float
    prompt_tok_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RequesterSnapshot(GroupSnapshot):
    """Token use of one requester."""

    requester: str
    tokens_last_24h: int
    """What counts against the daily quota."""
    virtual_counter: float
    """Virtual Token Counter value (weighted service), for diagnostics."""
    quota_tokens: int
    """Rolling 24 h budget (0 = unlimited)."""


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
class MemberSnapshot:
    """One server of a pool (``pool.ServerPool``)."""

    name: str
    state: ServerState
    scheduler: SchedulerSnapshot
    """Its own scheduler's snapshot (the requests sent to it directly included)."""
    served_total: int
    """Pool requests that ended well on it."""
    failures_total: int
    """Attempts that failed on it and moved to another server."""
    resumed_total: int
    """Answers it continued after another server failed in the middle of them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSnapshot:
    """A pool of servers at one instant."""

    taken_at: float
    members: Mapping[str, MemberSnapshot]
    preferred: Mapping[Lane, str | None]
    """The server each lane's next request would go to now (None: none of its servers is up)."""
    requests_total: int
    """Requests that ended, in whatever way."""
    failovers_total: int
    """Moves of a request to another server after one failed."""
    in_flight: int
    """Pool requests not ended yet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateResult:
    """A whole answer collected by ``Scheduler.generate``."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: TokenUsage
    finished: FinishedRequest


def build_snapshot(
    now: float,
    *,
    settings: SchedulerSettings,
    window_s: float,
    state: RunState,
    live: Iterable[QueuedRequest],
    lane_stats: Mapping[Lane, GroupStats],
    requester_stats: Mapping[str, GroupStats],
    quotas: QuotaLedger,
) -> SchedulerSnapshot:
    """Take a snapshot of a scheduler's state and its sliding-window metrics.

    ``live`` holds the requests still in the scheduler (waiting or running).
    """
    lanes: dict[Lane, LaneSnapshot] = {}
    finished = good = 0
    finished_total = rejected_total = preemptions_total = 0
    output_rate = prompt_rate = 0.0
    for lane in state.lanes:
        stats = lane_stats[lane]
        view = stats.view(now, window_s)
        finished += view.finished_in_window
        good += view.good_in_window
        finished_total += stats.finished_total
        rejected_total += stats.rejected_total
        preemptions_total += stats.preemptions_total
        output_rate += view.output_tok_s
        prompt_rate += view.prompt_tok_s
        lanes[lane] = LaneSnapshot(
            lane=lane,
            queue_depth=state.queued(lane),
            in_flight=state.running_by_lane[lane],
            good_per_s=view.good_per_s,
            prompt_tok_s=view.prompt_tok_s,
            **_group_fields(stats, view, (50, 90, 95, 99)),
        )
    waiting: dict[str, int] = {}
    running: dict[str, int] = {}
    for request in live:
        if request.waiting:
            waiting[request.requester] = waiting.get(request.requester, 0) + 1
        elif request.running:
            running[request.requester] = running.get(request.requester, 0) + 1
    requesters: dict[str, RequesterSnapshot] = {}
    # This server's requesters: the quota ledger may be the household's, shared by every server.
    for name, stats in requester_stats.items():
        view = stats.view(now, window_s)
        requesters[name] = RequesterSnapshot(
            requester=name,
            tokens_last_24h=quotas.used(name, now),
            virtual_counter=state.counters.total(name),
            quota_tokens=settings.quota_for(name),
            queue_depth=waiting.get(name, 0),
            in_flight=running.get(name, 0),
            **_group_fields(stats, view, (50, 95)),
        )
    background, total = state.share.shares(now)
    return SchedulerSnapshot(
        taken_at=now,
        settings=settings,
        lanes=lanes,
        requesters=requesters,
        queue_depth=state.waiting,
        in_flight=state.in_flight,
        prompt_tokens_in_flight=state.prompt_in_flight,
        output_tok_s=output_rate,
        prompt_tok_s=prompt_rate,
        goodput=good / finished if finished else None,
        rejected_total=rejected_total,
        preemptions_total=preemptions_total,
        window_s=window_s,
        background_service_share=background / total if total > 0 else None,
        finished_total=finished_total,
    )


def _group_fields(
    stats: GroupStats, view: StatsView, percentiles: tuple[int, ...]
) -> dict[str, Any]:
    """Return the fields of a ``GroupSnapshot`` (and of the lanes' tails) from a group's statistics.

    Totals, the window's counts and rates, and ``<metric>_p<NN>_s`` for each percentile.
    """
    fields: dict[str, Any] = {
        "finished_in_window": view.finished_in_window,
        "finished_total": stats.finished_total,
        "rejected_total": stats.rejected_total,
        "preemptions_total": stats.preemptions_total,
        "prompt_tokens_total": stats.prompt_tokens_total,
        "output_tokens_total": stats.output_tokens_total,
        "goodput": view.goodput,
        "output_tok_s": view.output_tok_s,
    }
    for metric in ("ttft", "itl", "e2e", "queue_wait"):
        window = getattr(view, metric)
        for p in percentiles:
            fields[f"{metric}_p{p}_s"] = getattr(window, f"p{p}")
    return fields
