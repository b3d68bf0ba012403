"""Who runs next.

This module decides, whenever a slot or some prefill budget frees up or a request arrives, which
waiting request is admitted to the server, and when a running background stream must give its slot to
a voice request. The scheduler (``scheduler.py``) only carries out these decisions.

Order under the ``lanes`` policy, highest first:

1. **Lane priority** — the lanes' order of service (``lanes.py``: voice, interactive, automation,
   background). A request that waited climbs one lane per ``aging_s`` seconds, but never as high
   as an urgent lane (voice): aged requests rank with the first other lane at best (interactive),
   and win ties with it by arrival.
2. **Background share** — when the yielding lanes (background) have work waiting and got less than
   ``background_share`` of the weighted service over the last ``share_window_s`` seconds, their
   next request ranks just below the urgent lanes (the share is taken from interactive and
   automation, never from voice).
3. **Inside a lane** — requests preempted earlier resume first; then Virtual Token Counter fairness
   (Sheng et al., OSDI 2024): each requester has a counter charged with the weighted tokens it is
   served (prompt at admission, output as it streams); the requester with the smallest counter goes
   next, and a requester that becomes backlogged again is lifted to the smallest counter of the
   backlogged requesters, so idling earns no credit.

Admission limits, checked for the best candidate first:

- ``max_sequences`` sequences in flight, of which ``headroom`` only voice and interactive may take.
  With preemption on, background borrows them while no voice or interactive work is active (or
  when the share ranked it up): the foreground takes them back by preemption when it comes, and
  an idle slot is not left unused for hours of nightly summaries. Only a request that can still
  be preempted borrows them (not one preempted ``max_preemptions`` times, not without
  preemption), so voice is never locked out by background it may not preempt.
- ``prefill_budget`` prompt tokens in flight; a single larger request runs alone rather than never.
- A lane's ``max_concurrency`` cap; ``background_paused``; while voice is active (waiting,
  streaming, or announced by ``Scheduler.prepare``) the prefill guard: a background request with a
  prompt longer than ``prefill_guard_tokens`` waits; while voice or interactive work is active,
  the background limit (``background_limit``: fixed by ``background_with_voice``, else learned in
  ``batch_cost.py``).

A candidate blocked by something of its own (lane cap, headroom, guard, pause) is skipped and the
next one is tried; a candidate blocked by the shared capacity (slots, prefill budget) stops the round,
so lower-ranked work cannot starve it. When that candidate is of a lane above background and
preemption is on, the running background stream with the least output is preempted instead:
background uses what the other lanes leave.

Before any of that (with preemption on), background makes way: while voice is active, a
background request whose long prompt the server is still prefilling is preempted (it has no output
to lose, and its prefill iteration would hold up voice's first token and stall its tokens); while
voice or interactive work is active, so is the least-advanced background stream beyond the
background limit.

The ``fifo`` policy serves requests in arrival order under ``max_sequences`` and ``prefill_budget``
only (what a server does on its own), for comparison. ``create_policy`` returns the policy that
``SchedulerSettings.policy`` names.

The rules read lanes by their traits (``foreground``, ``urgent``, ``yields``), never by name: in
what follows "voice" is an urgent lane, "voice or interactive" a foreground lane, "background" a
yielding lane and "automation" any other. What these decisions read is the bookkeeping of
``run_state.py`` (the waiting and running requests, the counters, the share ledger) and what
``foreground.py`` learned (headroom, background limit, an announced command). Aging is checked only on each lane's oldest request, so choosing is
O(log requesters), independent of the queue length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from custom_components.llm_lanes.core.foreground import Foreground
from custom_components.llm_lanes.core.run_state import QueuedRequest, RunState
from custom_components.llm_lanes.core.settings import Policy


@dataclass(frozen=True, slots=True)
class Admit:
    """Start this waiting request now."""

    request: QueuedRequest
    rank: float = field(default=0.0, compare=False)
    """The rank it was admitted at (its lane's place, or better by aging or the share)."""


@dataclass(frozen=True, slots=True)
class Preempt:
    """Cancel this running background stream and requeue it, then decide again."""

    victim: QueuedRequest


type Decision = Admit | Preempt | None


class SchedulingPolicy(ABC):
    """Decides what happens next from a server's run state and what it knows of the foreground."""

    __slots__ = ()

    @abstractmethod
    def choose(self, state: RunState, foreground: Foreground, now: float) -> Decision:
        """Admit a waiting request, preempt a stream, or wait (None)."""


def has_room(state: RunState, request: QueuedRequest) -> bool:
    """Whether the shared capacity takes the request: a free slot and room in the prefill budget.

    The budget bounds the prompt tokens the server prefills at once (vLLM's max batched tokens):
    a prompt counts from admission to its first token. With nothing in prefill any prompt may
    start: one larger than the whole budget is prefilled alone rather than never. An urgent
    request does not count the prompts prefilled in steps: they pause while it is active.
    """
    in_flight = state.in_flight
    if not in_flight:
        return True
    settings = state.settings
    prefilling = state.prefill_in_flight
    if request.lane.urgent:
        prefilling -= state.stepping_prefill
    return in_flight < max(settings.max_sequences, 1) and (
        not prefilling or prefilling + request.prompt_tokens <= settings.prefill_budget
    )


class FifoPolicy(SchedulingPolicy):
    """Arrival order under the shared capacity only (what a server does on its own)."""

    __slots__ = ()

    def choose(self, state: RunState, foreground: Foreground, now: float) -> Decision:
        """Admit the earliest waiting request if it fits."""
        request = state.first_waiting()
        if request is None or not has_room(state, request):
            return None
        return Admit(request, float(state.position[request.lane]))


class LanesPolicy(SchedulingPolicy):
    """Lanes, aging, background share, fairness, headroom, guards and preemption."""

    __slots__ = ()

    def choose(self, state: RunState, foreground: Foreground, now: float) -> Decision:
        """Decide what happens next: admit a waiting request, preempt a stream, or wait."""
        settings = state.settings
        running_by_lane = state.running_by_lane
        urgent_active = foreground.urgent_active(state, now)
        limit = foreground.background_limit(state, now)
        if (
            settings.preemption
            and state.running_in(state.yielding_lanes)
            and foreground.cancels_quickly()
        ):
            victim = _yield_to_foreground(
                state, urgent_active=urgent_active, limit=limit
            )
            if victim is not None:
                return Preempt(victim)
        if not state.waiting:
            return None
        max_sequences = max(settings.max_sequences, 1)
        headroom = foreground.headroom_slots(state)
        best_aged = len(state.urgent_lanes)
        share_rank = _share_rank(state)
        for rank, request in _candidates(state, now):
            lane = request.lane
            # Owed its share, background is admitted as the shared capacity allows, whatever
            # the voice-first mechanisms would hold back: they work inside the share.
            owed = lane.yields and rank == share_rank and _may_claim_share(state)
            if lane.yields:
                if settings.background_paused:
                    continue
                if not owed and (
                    (
                        urgent_active
                        and request.prompt_tokens > settings.prefill_guard_tokens
                    )
                    or _over_background_limit(state, limit)
                ):
                    continue
            cap = settings.lanes[lane].max_concurrency
            if cap is not None and running_by_lane[lane] >= cap:
                continue
            free = max_sequences - state.in_flight
            if (
                lane.yields
                and 0 < free <= headroom
                and not (settings.preemption and _preemptible(state, request))
            ):
                # Not even owed its share: voice could not take this slot back.
                continue
            # Aged to interactive's rank, a request takes the headroom as interactive does.
            takes_headroom = (
                lane.foreground or owed or (not lane.yields and rank <= best_aged)
            )
            if not takes_headroom and 0 < free <= headroom:
                if lane.yields:
                    if not _may_borrow_headroom(state, foreground, now):
                        continue
                else:
                    # Automation may not take the headroom; what background borrowed of the
                    # other slots it takes back.
                    victim = (
                        _least_advanced(state, rank) if settings.preemption else None
                    )
                    if victim is not None:
                        return Preempt(victim)
                    continue
            if not has_room(state, request):
                if (
                    not lane.yields
                    and settings.preemption
                    and _slot_soonest_by_preemption(state, foreground)
                ):
                    victim = _victim(state, request, rank)
                    if victim is not None:
                        return Preempt(victim)
                return None
            if (
                lane.foreground
                and not lane.urgent
                and settings.preemption
                and foreground.only_voice_warm_slots_free(now)
            ):
                # A typed chat's objective allows a prefill; voice's warm prompt is worth more
                # than a background stream's place: the chat takes a slot from background.
                victim = _least_advanced(state, rank)
                if victim is not None and not victim.stepping:
                    return Preempt(victim)
            return Admit(request, rank)
        return None


def _slot_soonest_by_preemption(state: RunState, foreground: Foreground) -> bool:
    """Whether cancelling a background stream frees a slot sooner than waiting would.

    Where the server lets go of a cancelled slot quickly, always. Where it takes most of a
    second (``Foreground.cancels_quickly``), only while no other foreground request runs: a
    command or a chat ends within that time, a background stream does not.
    """
    return foreground.cancels_quickly() or all(
        r.lane.yields for r in state.running.values()
    )


def _may_claim_share(state: RunState) -> bool:
    """Whether background, behind its share, may take one more slot for it.

    One claim at a time: not while a stream admitted for the share is still in its prefill.
    Its prompt is charged at admission and its tokens as they stream, so the share is looked at
    again with what that stream is doing before another slot goes to it: background catches up
    within the window without taking every slot that frees at once.
    """
    share_rank = _share_rank(state)
    return not any(
        r.prefilling and r.lane.yields and r.admitted_rank == share_rank
        for r in state.running.values()
    )


def _share_rank(state: RunState) -> float:
    """Rank of a background request raised by the background share: after the urgent lanes."""
    return len(state.urgent_lanes) - 0.5


def _may_borrow_headroom(state: RunState, foreground: Foreground, now: float) -> bool:
    """Whether background may take a headroom slot now (the foreground takes it back later).

    With preemption on: while no voice or interactive work is active and no automation waits
    (automation may not use the headroom, so it must not find background there instead of a slot
    of its own), unless taking it back is costly (``Foreground.lends_headroom``: long foreground
    prompts, a slow cancellation). (Owed its share, background takes the headroom anyway.)
    """
    if not (state.settings.preemption and foreground.lends_headroom()):
        return False
    return not (foreground.active(state, now) or state.queued_in(state.other_lanes))


def _preemptible(state: RunState, request: QueuedRequest) -> bool:
    """Whether a running request may be preempted: background, not too often already."""
    return request.lane.yields and request.preemptions < state.settings.max_preemptions


def _least_advanced(state: RunState, rank: float) -> QueuedRequest | None:
    """Return the background stream with the least output of those admitted below ``rank``."""
    victims = [
        r
        for r in state.running.values()
        if r.admitted_rank > rank and _preemptible(state, r)
    ]
    return min(victims, key=lambda r: (r.output_tokens, -r.seq)) if victims else None


def _candidates(state: RunState, now: float) -> list[tuple[float, QueuedRequest]]:
    """Each lane's next request (and its oldest one, if aged), best first."""
    settings = state.settings
    aging_s = settings.aging_s
    best_aged = len(state.urgent_lanes)
    share_rank = _share_rank(state)
    position = state.position
    ranked: list[tuple[float, float, int, QueuedRequest]] = []
    for lane, head, oldest in state.lane_heads(oldest=aging_s > 0):
        place = position[lane]
        ranked.append((float(place), head.enqueued_at, head.seq, head))
        if lane.urgent:
            continue
        if oldest is not None:
            steps = int((now - oldest.enqueued_at) // aging_s)
            rank = max(best_aged, place - steps)
            if rank < place:
                ranked.append((float(rank), oldest.enqueued_at, oldest.seq, oldest))
        if (
            lane.yields
            and settings.background_share > 0
            and state.share.background_behind(now, settings.background_share)
        ):
            ranked.append((share_rank, head.enqueued_at, head.seq, head))
    ranked.sort(key=lambda item: item[:3])
    return [(rank, request) for rank, _, _, request in ranked]


def _over_background_limit(state: RunState, limit: int | None) -> bool:
    """Whether background already runs as many streams as it may beside foreground work."""
    return limit is not None and state.running_in(state.yielding_lanes) >= limit


def _yield_to_foreground(
    state: RunState, *, urgent_active: bool, limit: int | None
) -> QueuedRequest | None:
    """Pick a background stream that must make way for active foreground work, if any.

    While voice is active, first a background request whose long prompt the server is still
    prefilling whole: it has no output to lose, and an iteration that prefills it would delay
    voice's first token (and stall voice's tokens) by the whole prompt (one prefilled in steps
    pauses instead). Then, while background runs more streams than its limit beside voice or
    interactive work, the least-advanced one (every extra sequence in the batch slows the
    foreground's tokens). Never a stream admitted for background's share (the share is not
    the foreground's to take), nor one preempted ``max_preemptions`` times already.
    """
    background = [r for r in state.running.values() if r.lane.yields]
    if not background:
        return None
    share_rank = _share_rank(state)
    movable = [
        r
        for r in background
        if r.admitted_rank != share_rank and not r.stepping and _preemptible(state, r)
    ]
    if not movable:
        return None
    if urgent_active:
        guard = state.settings.prefill_guard_tokens
        prefilling = [r for r in movable if r.prefilling and r.prompt_tokens > guard]
        if prefilling:
            return max(prefilling, key=lambda r: (r.prompt_tokens, r.seq))
    if limit is not None and len(background) > limit:
        return min(movable, key=lambda r: (r.output_tokens, -r.seq))
    return None


def _victim(
    state: RunState, request: QueuedRequest, rank: float
) -> QueuedRequest | None:
    """Pick the background stream to preempt for a higher lane's request, if that lets it run.

    Only streams admitted below ``rank``: background that aging or its share lifted over a lane
    keeps its slot against that lane (voice takes any).
    """
    settings = state.settings
    if state.in_flight >= max(settings.max_sequences, 1):
        return _least_advanced(state, rank)
    # Blocked by the prefill budget: only background prompts still in prefill are in the way,
    # and preempting them helps only if the request fits once they are gone.
    victims = [
        r
        for r in state.running.values()
        if r.admitted_rank > rank and r.prefilling and _preemptible(state, r)
    ]
    others = state.prefill_in_flight - sum(r.prompt_tokens for r in victims)
    if not victims or (
        others and others + request.prompt_tokens > settings.prefill_budget
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
