"""Scheduler settings.

Every knob of admission, ordering, fairness and preemption, with defaults that suit a single home
GPU serving one model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from custom_components.llm_lanes.core.lanes import DEFAULT_LANE_LIMITS, Lane, LaneLimits


class Policy(StrEnum):
    """How the next request is chosen."""

    LANES = "lanes"
    """Lane priority, aging, background share, per-requester fairness, preemption."""
    FIFO = "fifo"
    """Arrival order under the same admission limits (for comparison)."""


class QuotaAction(StrEnum):
    """What happens to a request whose requester has spent their daily token quota."""

    DEMOTE = "demote"
    """Run it in the background lane."""
    REJECT = "reject"
    """Refuse it with a clear error."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSettings:
    """Immutable settings; change them with ``dataclasses.replace`` and ``Scheduler.update_settings``."""

    policy: Policy = Policy.LANES
    max_sequences: int = 4
    """Sequences in flight at the server at once (defaults to the server's slot count)."""
    prefill_budget: int = 4096
    """The most prompt tokens in flight at once; a single larger request runs alone."""
    headroom: int = 1
    """Slots only voice and interactive requests may take."""
    aging_s: float = 30.0
    """A waiting request climbs one lane per this many seconds (never above voice)."""
    background_share: float = 0.1
    """Fraction of weighted service guaranteed to background over ``share_window_s`` when it waits."""
    share_window_s: float = 60.0
    preemption: bool = True
    """Cancel the least-advanced background stream when voice finds no slot, and resume it later."""
    prefill_guard_tokens: int = 512
    """While voice waits or streams, background requests with a longer prompt wait, and one the
    server is still prefilling is preempted (with preemption on). A home GPU prefills 512 tokens of
    an 8B model in about 80 ms, within voice's 100 ms inter-token objective."""
    background_with_voice: int | None = None
    """Most background streams while voice or interactive requests wait or stream (extra ones are
    preempted, with preemption on); None: learned (``batch_cost.py``): as many as keep the active
    foreground lanes within their inter-token objectives (``itl_slo_s`` and, against their speed
    alone, ``itl_slowdown_slo``)."""
    max_preemptions: int = 2
    """How often one request may be preempted; after that it keeps its slot to the end, so a
    started request always makes progress."""
    prefill_step_s: float = 0.025
    """Where the server can prefill a prompt into a slot in steps (llama.cpp), background prompts
    longer than a step are prefilled in steps of about this long (the step size is learned), so
    a voice command never waits behind a whole long prompt; 0: off."""
    slot_placement: bool = True
    """Where the server lets clients choose (llama.cpp), place every request on a slot chosen for
    its prompt cache (``slots.py``); off: the server chooses."""
    learn_headroom: bool = False
    """Grow the headroom to the foreground's concurrency while its prompts are long
    (``headroom.py``). Off by default: on a GPU, where background's tokens/s grows with its
    batch, two slots kept warm cost background a quarter of its tokens for a voice tail that is
    already within its objective (README *Ablation*); on a CPU it changes little."""
    announcements: bool = True
    """Make room for a voice command announced before its text (``Scheduler.prepare``)."""
    server_slots: int | None = None
    """Slots the server has, where it says (llama.cpp); the scheduler places requests on them."""
    input_weight: float = 1.0
    """Virtual Token Counter weight of a prompt token."""
    output_weight: float = 2.0
    """Virtual Token Counter weight of an output token."""
    background_paused: bool = False
    """When set, no background request is admitted (running ones finish)."""
    quota_tokens_per_day: int = 0
    """Default rolling 24 h token budget per requester; 0 means unlimited."""
    requester_quotas: dict[str, int] = field(default_factory=dict)
    """Per-requester overrides of ``quota_tokens_per_day``."""
    quota_action: QuotaAction = QuotaAction.DEMOTE
    lanes: dict[Lane, LaneLimits] = field(
        default_factory=lambda: dict(DEFAULT_LANE_LIMITS)
    )
    """The lanes the scheduler runs (the household's four by default) and their limits."""

    def with_lane(self, lane: Lane, **changes: Any) -> SchedulerSettings:
        """Return a copy with some limits of one lane changed."""
        lanes = dict(self.lanes)
        lanes[lane] = replace(lanes[lane], **changes)
        return replace(self, lanes=lanes)

    def quota_for(self, requester: str) -> int:
        """Daily token quota of a requester (0 = unlimited)."""
        return self.requester_quotas.get(requester, self.quota_tokens_per_day)

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """Names accepted by ``with_values`` (the benchmark's ``--set``)."""
        return frozenset(f.name for f in fields(cls)) - {"lanes", "requester_quotas"}

    def with_values(self, values: dict[str, str]) -> SchedulerSettings:
        """Return a copy with top-level settings parsed from strings (``key=value`` overrides).

        Lane limits use ``<lane>.<limit>`` keys, e.g. ``voice.ttft_slo_s=0.3``.
        """
        result = self
        top: dict[str, Any] = {}
        for key, raw in values.items():
            if "." in key:
                lane_key, limit = key.split(".", 1)
                lane = Lane.from_key(lane_key, result.lanes)
                if not hasattr(result.lanes[lane], limit):
                    raise ValueError(f"unknown lane limit {limit!r}")
                current = getattr(result.lanes[lane], limit)
                result = result.with_lane(lane, **{limit: _parse_like(current, raw)})
                continue
            if key not in self.field_names():
                raise ValueError(
                    f"unknown scheduler setting {key!r}; known: {', '.join(sorted(self.field_names()))}"
                )
            top[key] = _parse_like(getattr(self, key), raw)
        return replace(result, **top)


def _parse_like(current: Any, raw: str) -> Any:
    if isinstance(current, bool):
        if raw.lower() in {"1", "true", "yes", "on"}:
            return True
        if raw.lower() in {"0", "false", "no", "off"}:
            return False
        raise ValueError(f"expected a boolean, got {raw!r}")
    if isinstance(current, StrEnum):
        return type(current)(raw)
    if isinstance(current, int) or current is None:
        return None if raw.lower() == "none" else int(raw)
    if isinstance(current, float):
        return float(raw)
    return raw
