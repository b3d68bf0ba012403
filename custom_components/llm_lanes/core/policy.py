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
only (what a server does on its own), for comparison.

Cost: per-lane per-requester FIFOs, one heap of backlogged requesters per lane keyed by counter
(stale keys re-keyed lazily, since counters only grow), lazy deletion everywhere, and aging checked
only on each lane's oldest request. Choosing is O(log requesters), independent of the queue length.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
import heapq

from .lanes import Lane
from .settings import Policy, SchedulerSettings

_LANES = tuple(Lane)
_SHARE_RANK = 0.5
"""Rank of a background request raised by the background share: after voice, before interactive."""
_OLDEST_AGED_RANK = 1
"""Aging lifts a request at most to interactive's rank."""


@dataclass(slots=True, eq=False)
class Entry:
    """A request as the policy sees it: no prompt text, only what ordering and admission need."""

    seq: int
    """Unique, increasing with arrival."""
    lane: Lane
    """The lane it waits and runs in (after any quota demotion)."""
    requester: str
    prompt_tokens: int
    """Prompt tokens it occupies while running (grows by the kept output after a preemption)."""
    enqueued_at: float
    """When it (last) joined the queue."""
    deadline_s: float | None = None
    """The caller's own limit on waiting, if tighter than the lane's."""
    expires_at: float = float("inf")
    resumed: bool = False
    """Requeued after a preemption: it goes before the rest of its lane."""
    waiting: bool = False
    running: bool = False
    output_tokens: int = 0
    """Progress so far, used to pick the least-advanced stream to preempt."""
    prefilling: bool = False
    """Running, and its current attempt has produced no token yet (the server is on its prompt)."""


@dataclass(frozen=True, slots=True)
class Admit:
    """Start this waiting request now."""

    entry: Entry


@dataclass(frozen=True, slots=True)
class Preempt:
    """Cancel this running background stream and requeue it, then decide again."""

    victim: Entry


type Decision = Admit | Preempt | None


class VirtualCounters:
    """Virtual Token Counters: weighted service per requester, one set per lane."""

    __slots__ = ("_counters",)

    def __init__(self) -> None:
        """Start every counter at zero."""
        self._counters: tuple[dict[str, float], ...] = tuple({} for _ in _LANES)

    def lane(self, lane: Lane) -> dict[str, float]:
        """Return the counters of one lane (mutable: the scheduler charges them per token)."""
        return self._counters[lane]

    def total(self, requester: str) -> float:
        """Counter of a requester summed over lanes (for diagnostics)."""
        return sum(counters.get(requester, 0.0) for counters in self._counters)


class ShareLedger:
    """Weighted service over a sliding window: background's part and the total.

    Kept in coarse buckets so that charging a streamed token is two additions.
    """

    __slots__ = ("_background", "_buckets", "_total", "window_s")

    BUCKETS = 64

    def __init__(self, window_s: float) -> None:
        """Start empty."""
        self.window_s = window_s
        self._buckets: deque[list[float]] = deque()
        self._background = 0.0
        self._total = 0.0

    def add(self, now: float, amount: float, *, background: bool) -> None:
        """Charge service given at ``now``."""
        buckets = self._buckets
        if buckets and now < buckets[-1][0] + self.window_s / self.BUCKETS:
            bucket = buckets[-1]
        else:
            bucket = [now, 0.0, 0.0]
            buckets.append(bucket)
        bucket[2] += amount
        self._total += amount
        if background:
            bucket[1] += amount
            self._background += amount

    def shares(self, now: float) -> tuple[float, float]:
        """Background service and total service over the window ending at ``now``."""
        buckets = self._buckets
        horizon = now - self.window_s
        while buckets and buckets[0][0] < horizon:
            _, background, total = buckets.popleft()
            self._background -= background
            self._total -= total
        if not buckets:
            self._background = self._total = 0.0
        return self._background, self._total

    def background_behind(self, now: float, share: float) -> bool:
        """Whether background got less than ``share`` of the service in the window."""
        background, total = self.shares(now)
        return total > 0 and background < share * total


@dataclass(slots=True, eq=False)
class _LaneQueue:
    """The waiting requests of one lane."""

    resumed: deque[Entry] = field(default_factory=deque)
    """Preempted requests, served before the others."""
    arrivals: deque[Entry] = field(default_factory=deque)
    """Non-resumed requests in arrival order (for aging); removal is lazy."""
    by_requester: dict[str, deque[Entry]] = field(default_factory=dict)
    waiting_of: dict[str, int] = field(default_factory=dict)
    """Live waiting requests per requester (0 or absent: not backlogged)."""
    heap: list[tuple[float, int, str]] = field(default_factory=list)
    """(counter when pushed, version, requester) of backlogged requesters."""
    version: dict[str, int] = field(default_factory=dict)
    """The version of each requester's one valid heap item."""
    count: int = 0
    last_counter: float = 0.0
    """Counter of the requester served last (lift target when nobody is backlogged)."""


def _clean(queue: deque[Entry], *, resumed: bool) -> Entry | None:
    """Drop entries that left this queue from its head; return the head."""
    while queue and not (queue[0].waiting and queue[0].resumed is resumed):
        queue.popleft()
    return queue[0] if queue else None


class RunQueue:
    """Waiting and running requests of one server, and the decision of what runs next."""

    def __init__(self, settings: SchedulerSettings) -> None:
        """Start empty."""
        self.settings = settings
        self.counters = VirtualCounters()
        self.share = ShareLedger(settings.share_window_s)
        self._lanes = tuple(_LaneQueue() for _ in _LANES)
        self._fifo: deque[Entry] = deque()
        self._expiry: list[tuple[float, int, Entry]] = []
        self._version = 0
        self.waiting = 0
        self.in_flight = 0
        self.prompt_in_flight = 0
        self.running_by_lane = [0] * len(_LANES)
        self.running: dict[int, Entry] = {}
        self.started_total = 0
        self.released_total = 0

    # --- settings -------------------------------------------------------------------------------

    def update_settings(self, settings: SchedulerSettings) -> None:
        """Apply new settings; waiting requests get expiry times from the new lane limits."""
        self.settings = settings
        self.share.window_s = settings.share_window_s
        self._expiry = []
        for queue in self._lanes:
            for entry in (*queue.resumed, *queue.arrivals):
                if entry.waiting:
                    self._set_expiry(entry)

    def queued(self, lane: Lane) -> int:
        """Count the requests waiting in a lane."""
        return self._lanes[lane].count

    # --- queue changes ----------------------------------------------------------------------------

    def push(self, entry: Entry) -> None:
        """Queue a new request at the back of its lane (lifting its requester's counter if idle)."""
        queue = self._lanes[entry.lane]
        entry.waiting = True
        requester = entry.requester
        waiting = queue.waiting_of.get(requester, 0)
        if waiting == 0:
            self._lift(entry.lane, queue, requester)
            self._version += 1
            queue.version[requester] = self._version
            heapq.heappush(
                queue.heap,
                (self.counters.lane(entry.lane)[requester], self._version, requester),
            )
        queue.waiting_of[requester] = waiting + 1
        fifo = queue.by_requester.get(requester)
        if fifo is None:
            fifo = queue.by_requester[requester] = deque()
        fifo.append(entry)
        queue.arrivals.append(entry)
        self._fifo.append(entry)
        queue.count += 1
        self.waiting += 1
        self._set_expiry(entry)

    def requeue_front(self, entry: Entry, now: float) -> None:
        """Put a preempted request back at the head of its lane."""
        queue = self._lanes[entry.lane]
        entry.waiting = True
        entry.resumed = True
        entry.enqueued_at = now
        queue.resumed.append(entry)
        self._fifo.appendleft(entry)
        queue.count += 1
        self.waiting += 1
        self._set_expiry(entry)

    def remove(self, entry: Entry) -> None:
        """Take a request out of the queue (admitted, cancelled or timed out); removal is lazy."""
        if not entry.waiting:
            return
        entry.waiting = False
        queue = self._lanes[entry.lane]
        queue.count -= 1
        self.waiting -= 1
        self._trim(queue)
        if entry.resumed:
            return
        requester = entry.requester
        left = queue.waiting_of[requester] - 1
        if left:
            queue.waiting_of[requester] = left
        else:
            del queue.waiting_of[requester]
            del queue.version[requester]
            del queue.by_requester[requester]

    def _trim(self, queue: _LaneQueue) -> None:
        """Drop departed entries from the heads of the lazy structures, so memory stays bounded."""
        fifo = self._fifo
        while fifo and not fifo[0].waiting:
            fifo.popleft()
        _clean(queue.arrivals, resumed=False)
        _clean(queue.resumed, resumed=True)
        expiry = self._expiry
        if len(expiry) > 2 * self.waiting + 64:
            self._expiry = [
                item
                for item in expiry
                if item[2].waiting and item[2].expires_at == item[0]
            ]
            heapq.heapify(self._expiry)

    def pop_expired(self, now: float) -> list[Entry]:
        """Remove and return the waiting requests whose wait limit has passed."""
        expired: list[Entry] = []
        # ``remove`` may rebuild the heap, so it is read afresh on every round.
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, _, entry = heapq.heappop(self._expiry)
            if entry.waiting and entry.expires_at == expires_at:
                self.remove(entry)
                expired.append(entry)
        return expired

    def next_expiry(self) -> float | None:
        """When the next waiting request times out, if any waits."""
        heap = self._expiry
        while heap and (not heap[0][2].waiting or heap[0][2].expires_at != heap[0][0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # --- running requests ----------------------------------------------------------------------------

    def start(self, entry: Entry) -> None:
        """Admit a request chosen by ``choose``: it leaves the queue and takes its slot."""
        self.remove(entry)
        self._lanes[entry.lane].last_counter = self.counters.lane(entry.lane).get(
            entry.requester, 0.0
        )
        entry.running = True
        entry.prefilling = True
        self.in_flight += 1
        self.prompt_in_flight += entry.prompt_tokens
        self.running_by_lane[entry.lane] += 1
        self.running[entry.seq] = entry
        self.started_total += 1

    def release(self, entry: Entry) -> bool:
        """Free a running request's slot; return False when it held none (already released)."""
        if not entry.running:
            return False
        entry.running = False
        entry.prefilling = False
        self.in_flight -= 1
        self.prompt_in_flight -= entry.prompt_tokens
        self.running_by_lane[entry.lane] -= 1
        del self.running[entry.seq]
        self.released_total += 1
        return True

    # --- the decision ------------------------------------------------------------------------------

    def choose(self, now: float) -> Decision:
        """Decide what happens next: admit a waiting request, preempt a stream, or wait."""
        if not self.waiting:
            return None
        if self.settings.policy is Policy.FIFO:
            return self._choose_fifo()
        settings = self.settings
        max_sequences = max(settings.max_sequences, 1)
        headroom = min(max(settings.headroom, 0), max_sequences - 1)
        voice_active = bool(self.running_by_lane[Lane.VOICE] or self.queued(Lane.VOICE))
        if voice_active and settings.preemption:
            victim = self._yield_to_voice()
            if victim is not None:
                return Preempt(victim)
        for rank, entry in self._candidates(now):
            lane = entry.lane
            if lane is Lane.BACKGROUND:
                if settings.background_paused:
                    continue
                if voice_active and (
                    entry.prompt_tokens > settings.prefill_guard_tokens
                    or self._over_voice_cap()
                ):
                    continue
            cap = settings.lanes[lane].max_concurrency
            if cap is not None and self.running_by_lane[lane] >= cap:
                continue
            free = max_sequences - self.in_flight
            if (
                lane >= Lane.AUTOMATION
                and 0 < free <= headroom
                and not (rank == _SHARE_RANK and settings.preemption)
            ):
                continue
            if free <= 0 or (
                self.in_flight
                and self.prompt_in_flight + entry.prompt_tokens
                > settings.prefill_budget
            ):
                if lane is Lane.VOICE and settings.preemption:
                    victim = self._victim(entry)
                    if victim is not None:
                        return Preempt(victim)
                return None
            return Admit(entry)
        return None

    def _candidates(self, now: float) -> list[tuple[float, Entry]]:
        """Each lane's next request (and its oldest one, if aged), best first."""
        settings = self.settings
        ranked: list[tuple[float, float, int, Entry]] = []
        for lane in _LANES:
            queue = self._lanes[lane]
            if not queue.count:
                continue
            head = self._head(lane, queue)
            ranked.append((float(lane), head.enqueued_at, head.seq, head))
            if lane is Lane.VOICE:
                continue
            if settings.aging_s > 0:
                oldest = _clean(queue.resumed, resumed=True) or _clean(
                    queue.arrivals, resumed=False
                )
                if oldest is not None:
                    steps = int((now - oldest.enqueued_at) // settings.aging_s)
                    rank = max(_OLDEST_AGED_RANK, lane - steps)
                    if rank < lane:
                        ranked.append(
                            (float(rank), oldest.enqueued_at, oldest.seq, oldest)
                        )
            if (
                lane is Lane.BACKGROUND
                and settings.background_share > 0
                and self.share.background_behind(now, settings.background_share)
            ):
                ranked.append((_SHARE_RANK, head.enqueued_at, head.seq, head))
        ranked.sort(key=lambda item: item[:3])
        return [(rank, entry) for rank, _, _, entry in ranked]

    def _head(self, lane: Lane, queue: _LaneQueue) -> Entry:
        """Return the lane's next request: a resumed one, else the least-served requester's oldest."""
        resumed = _clean(queue.resumed, resumed=True)
        if resumed is not None:
            return resumed
        requester = self._least_served(lane, queue)
        entry = _clean(queue.by_requester[requester], resumed=False)
        assert entry is not None  # a backlogged requester has a waiting request
        return entry

    def _least_served(self, lane: Lane, queue: _LaneQueue) -> str:
        """Return the backlogged requester with the smallest counter (re-keying stale items)."""
        heap = queue.heap
        counters = self.counters.lane(lane)
        while True:
            key, version, requester = heap[0]
            if queue.version.get(requester) != version:
                heapq.heappop(heap)
                continue
            counter = counters[requester]
            if key < counter:
                self._version += 1
                queue.version[requester] = self._version
                heapq.heapreplace(heap, (counter, self._version, requester))
                continue
            return requester

    def _lift(self, lane: Lane, queue: _LaneQueue, requester: str) -> None:
        """VTC: a requester joining the backlog starts no lower than the least-served one there."""
        counters = self.counters.lane(lane)
        floor = (
            counters[self._least_served(lane, queue)]
            if queue.waiting_of
            else queue.last_counter
        )
        counters[requester] = max(counters.get(requester, 0.0), floor)

    def _over_voice_cap(self) -> bool:
        """Whether background already runs as many streams as it may while voice is active."""
        cap = self.settings.background_with_voice
        return cap is not None and self.running_by_lane[Lane.BACKGROUND] >= cap

    def _yield_to_voice(self) -> Entry | None:
        """Pick a background stream that must make way for active voice work, if any.

        First a background request whose long prompt the server is still prefilling: it has no
        output to lose, and an iteration that prefills it would delay voice's first token (and
        stall voice's tokens) by the whole prompt. Then, while background runs more streams than
        ``background_with_voice``, the least-advanced one (decode time grows with the streams).
        """
        background = [e for e in self.running.values() if e.lane is Lane.BACKGROUND]
        if not background:
            return None
        guard = self.settings.prefill_guard_tokens
        prefilling = [e for e in background if e.prefilling and e.prompt_tokens > guard]
        if prefilling:
            return max(prefilling, key=lambda e: (e.prompt_tokens, e.seq))
        cap = self.settings.background_with_voice
        if cap is not None and len(background) > cap:
            return min(background, key=lambda e: (e.output_tokens, -e.seq))
        return None

    def _victim(self, entry: Entry) -> Entry | None:
        """Pick the background stream to preempt for a voice request, if that lets it run."""
        victims = [e for e in self.running.values() if e.lane is Lane.BACKGROUND]
        if not victims:
            return None
        if self.in_flight < max(self.settings.max_sequences, 1):
            # Blocked by the prefill budget: preempt only if dropping background makes it fit.
            others = self.prompt_in_flight - sum(e.prompt_tokens for e in victims)
            if len(victims) < self.in_flight and others + entry.prompt_tokens > (
                self.settings.prefill_budget
            ):
                return None
        return min(victims, key=lambda e: (e.output_tokens, -e.seq))

    def _choose_fifo(self) -> Decision:
        fifo = self._fifo
        while fifo and not fifo[0].waiting:
            fifo.popleft()
        if not fifo:
            return None
        entry = fifo[0]
        if self.in_flight >= max(self.settings.max_sequences, 1) or (
            self.in_flight
            and self.prompt_in_flight + entry.prompt_tokens
            > self.settings.prefill_budget
        ):
            return None
        return Admit(entry)

    def _set_expiry(self, entry: Entry) -> None:
        wait = self.settings.lanes[entry.lane].max_wait_s
        if entry.deadline_s is not None:
            wait = min(wait, entry.deadline_s)
        entry.expires_at = entry.enqueued_at + wait
        heapq.heappush(self._expiry, (entry.expires_at, entry.seq, entry))
