"""Who runs next.

This module decides, whenever a slot or some prefill budget frees up or a request arrives, which
waiting request is admitted to the server, and when a running background stream must give its slot to
a voice request. The scheduler (``scheduler.py``) only carries out these decisions.

Order under the ``lanes`` policy, highest first:

1. **Lane priority** — voice, interactive, automation, background. A request that waited climbs one
   lane per ``aging_s`` seconds, but never as high as voice (aged requests rank with interactive at
   best, and win ties with it by arrival).
2. **Background share** — when background has work waiting and got less than ``background_share`` of
   the weighted service over the last ``share_window_s`` seconds, its next request ranks just below
   voice (the share is taken from interactive and automation, never from voice).
3. **Inside a lane** — requests preempted earlier resume first; then Virtual Token Counter fairness
   (Sheng et al., OSDI 2024): each requester has a counter charged with the weighted tokens it is
   served (prompt at admission, output as it streams); the requester with the smallest counter goes
   next, and a requester that becomes backlogged again is lifted to the smallest counter of the
   backlogged requesters, so idling earns no credit.

Admission limits, checked for the best candidate first:

- ``max_sequences`` sequences in flight, of which ``headroom`` only voice and interactive may take
  (a background request ranked up by the share may use them while preemption is on: voice takes them
  back by preemption).
- ``prefill_budget`` prompt tokens in flight; a single larger request runs alone rather than never.
- A lane's ``max_concurrency`` cap; ``background_paused``; while voice waits or streams, the prefill
  guard (a background request with a prompt longer than ``prefill_guard_tokens`` waits) and the
  ``background_with_voice`` cap on background streams.

A candidate blocked by something of its own (lane cap, headroom, guard, pause) is skipped and the
next one is tried; a candidate blocked by the shared capacity (slots, prefill budget) stops the round,
so lower-ranked work cannot starve it. When that candidate is a voice request and preemption is on,
the running background stream with the least output is preempted instead.

Before any of that, while voice waits or streams (and preemption is on), background makes way: a
background request whose long prompt the server is still prefilling is preempted (it has no output
to lose, and its prefill iteration would hold up voice's first token and stall its tokens), and so
is the least-advanced background stream beyond ``background_with_voice``.

The ``fifo`` policy serves requests in arrival order under ``max_sequences`` and ``prefill_budget``
only (what a server does on its own), for comparison. ``create_policy`` returns the policy that
``SchedulerSettings.policy`` names.

What these decisions read (the waiting and running requests, the counters, the share ledger) is
kept in ``run_state.py``. Aging is checked only on each lane's oldest request, so choosing is
O(log requesters), independent of the queue length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from .lanes import Lane
from .run_state import QueuedRequest, RunState
from .settings import Policy

_SHARE_RANK = 0.5
"""Rank of a background request raised by the background share: after voice, before interactive."""
_OLDEST_AGED_RANK = 1
"""Aging lifts a request at most to interactive's rank."""


@dataclass(frozen=True, slots=True)
class Admit:
    """Start this waiting request now."""

    request: QueuedRequest


@dataclass(frozen=True, slots=True)
class Preempt:
    """Cancel this running background stream and requeue it, then decide again."""

    victim: QueuedRequest


type Decision = Admit | Preempt | None


class SchedulingPolicy(ABC):
    """Decides what happens next from a server's run state (and its settings)."""

    __slots__ = ()

    @abstractmethod
    def choose(self, state: RunState, now: float) -> Decision:
        """Admit a waiting request, preempt a stream, or wait (None)."""


def has_room(state: RunState, request: QueuedRequest) -> bool:
    """Whether the shared capacity takes the request: a free slot and room in the prefill budget.

    An idle server takes any request: one larger than the whole budget runs alone rather than never.
    """
    in_flight = state.in_flight
    if not in_flight:
        return True
    settings = state.settings
    return (
        in_flight < max(settings.max_sequences, 1)
        and state.prompt_in_flight + request.prompt_tokens <= settings.prefill_budget
    )


class FifoPolicy(SchedulingPolicy):
    """Arrival order under the shared capacity only (what a server does on its own)."""

    __slots__ = ()

    def choose(self, state: RunState, now: float) -> Decision:
        """Admit the earliest waiting request if it fits."""
        request = state.first_waiting()
        if request is None or not has_room(state, request):
            return None
        return Admit(request)


class LanesPolicy(SchedulingPolicy):
    """Lanes, aging, background share, fairness, headroom, guards and preemption."""

    __slots__ = ()

    def choose(self, state: RunState, now: float) -> Decision:
        """Decide what happens next: admit a waiting request, preempt a stream, or wait."""
        if not state.waiting:
            return None
        settings = state.settings
        max_sequences = max(settings.max_sequences, 1)
        headroom = min(max(settings.headroom, 0), max_sequences - 1)
        running_by_lane = state.running_by_lane
        voice_active = bool(running_by_lane[Lane.VOICE] or state.queued(Lane.VOICE))
        if voice_active and settings.preemption:
            victim = _yield_to_voice(state)
            if victim is not None:
                return Preempt(victim)
        for rank, request in _candidates(state, now):
            lane = request.lane
            if lane is Lane.BACKGROUND:
                if settings.background_paused:
                    continue
                if voice_active and (
                    request.prompt_tokens > settings.prefill_guard_tokens
                    or _over_voice_cap(state)
                ):
                    continue
            cap = settings.lanes[lane].max_concurrency
            if cap is not None and running_by_lane[lane] >= cap:
                continue
            free = max_sequences - state.in_flight
            if (
                lane >= Lane.AUTOMATION
                and 0 < free <= headroom
                and not (rank == _SHARE_RANK and settings.preemption)
            ):
                continue
            if not has_room(state, request):
                if lane is Lane.VOICE and settings.preemption:
                    victim = _victim(state, request)
                    if victim is not None:
                        return Preempt(victim)
                return None
            return Admit(request)
        return None


def _candidates(state: RunState, now: float) -> list[tuple[float, QueuedRequest]]:
    """Each lane's next request (and its oldest one, if aged), best first."""
    settings = state.settings
    aging_s = settings.aging_s
    ranked: list[tuple[float, float, int, QueuedRequest]] = []
    for lane, head, oldest in state.lane_heads(oldest=aging_s > 0):
        ranked.append((float(lane), head.enqueued_at, head.seq, head))
        if lane is Lane.VOICE:
            continue
        if oldest is not None:
            steps = int((now - oldest.enqueued_at) // aging_s)
            rank = max(_OLDEST_AGED_RANK, lane - steps)
            if rank < lane:
                ranked.append((float(rank), oldest.enqueued_at, oldest.seq, oldest))
        if (
            lane is Lane.BACKGROUND
            and settings.background_share > 0
            and state.share.background_behind(now, settings.background_share)
        ):
            ranked.append((_SHARE_RANK, head.enqueued_at, head.seq, head))
    ranked.sort(key=lambda item: item[:3])
    return [(rank, request) for rank, _, _, request in ranked]


def _over_voice_cap(state: RunState) -> bool:
    """Whether background already runs as many streams as it may while voice is active."""
    cap = state.settings.background_with_voice
    return cap is not None and state.running_by_lane[Lane.BACKGROUND] >= cap


def _yield_to_voice(state: RunState) -> QueuedRequest | None:
    """Pick a background stream that must make way for active voice work, if any.

    First a background request whose long prompt the server is still prefilling: it has no
    output to lose, and an iteration that prefills it would delay voice's first token (and
    stall voice's tokens) by the whole prompt. Then, while background runs more streams than
    ``background_with_voice``, the least-advanced one (decode time grows with the streams).
    """
    background = [r for r in state.running.values() if r.lane is Lane.BACKGROUND]
    if not background:
        return None
    settings = state.settings
    guard = settings.prefill_guard_tokens
    prefilling = [r for r in background if r.prefilling and r.prompt_tokens > guard]
    if prefilling:
        return max(prefilling, key=lambda r: (r.prompt_tokens, r.seq))
    cap = settings.background_with_voice
    if cap is not None and len(background) > cap:
        return min(background, key=lambda r: (r.output_tokens, -r.seq))
    return None


def _victim(state: RunState, request: QueuedRequest) -> QueuedRequest | None:
    """Pick the background stream to preempt for a voice request, if that lets it run."""
    victims = [r for r in state.running.values() if r.lane is Lane.BACKGROUND]
    if not victims:
        return None
    settings = state.settings
    if state.in_flight < max(settings.max_sequences, 1):
        # Blocked by the prefill budget: preempt only if dropping background makes it fit.
        others = state.prompt_in_flight - sum(r.prompt_tokens for r in victims)
        if len(victims) < state.in_flight and others + request.prompt_tokens > (
            settings.prefill_budget
        ):
            return None
    return min(victims, key=lambda r: (r.output_tokens, -r.seq))


_POLICIES: dict[Policy, type[SchedulingPolicy]] = {
    Policy.LANES: LanesPolicy,
    Policy.FIFO: FifoPolicy,
}


def create_policy(policy: Policy) -> SchedulingPolicy:
    """Return the decision-maker of a policy setting (as vLLM's ``create_request_queue``)."""
    return _POLICIES[policy]()
