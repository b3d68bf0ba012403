"""What waits and what runs at one server, and the service each requester got.

This is the bookkeeping the policy (``policy.py``) decides on; it decides nothing itself. It keeps:

- the waiting requests of each lane: preempted ones (resumed first), the others in arrival order
  (for aging) and per requester (for fairness), plus one arrival order across lanes (for ``fifo``);
- per lane, a heap of backlogged requesters keyed by their Virtual Token Counter, and the counters;
- the expiry heap of the waiting requests' wait limits;
- the running requests, the slots and the prompt tokens they hold (and of those, the prompts the
  server is still prefilling);
- the background share's sliding window of weighted service (of the yielding lanes).

What the scheduler learns of the foreground (headroom, the background limit, an announced voice
command) is kept by ``foreground.py``, not here.

Cost: per-lane per-requester FIFOs, one heap of backlogged requesters per lane keyed by counter
(stale keys re-keyed lazily, since counters only grow), lazy deletion everywhere: a departed
request leaves the structures when it reaches their head, so no change is worse than
O(log requesters), independent of the queue length.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
import heapq

from custom_components.llm_lanes.core.lanes import Lane, check_lanes
from custom_components.llm_lanes.core.settings import SchedulerSettings


@dataclass(slots=True, eq=False)
class QueuedRequest:
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
    admitted_rank: float = 0.0
    """The rank the policy admitted it at (its lane, or better by aging or the share)."""
    preemptions: int = 0
    """How often it was preempted (``SchedulerSettings.max_preemptions`` bounds it)."""
    stepping: bool = False
    """Running, and its long prompt is being prefilled in steps (``prefill_steps.py``): it
    pauses between steps while an urgent lane is active, so it is never preempted for one."""


class VirtualCounters:
    """Virtual Token Counters: weighted service per requester, one set per lane."""

    __slots__ = ("_counters",)

    def __init__(self, lanes: tuple[Lane, ...]) -> None:
        """Start every counter at zero."""
        self._counters: dict[Lane, dict[str, float]] = {lane: {} for lane in lanes}

    def lane(self, lane: Lane) -> dict[str, float]:
        """Return the counters of one lane (mutable: the scheduler charges them per token)."""
        return self._counters[lane]

    def total(self, requester: str) -> float:
        """Counter of a requester summed over lanes (for diagnostics)."""
        return sum(counters.get(requester, 0.0) for counters in self._counters.values())


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

    resumed: deque[QueuedRequest] = field(default_factory=deque)
    """Preempted requests, served before the others."""
    arrivals: deque[QueuedRequest] = field(default_factory=deque)
    """Non-resumed requests in arrival order (for aging); removal is lazy."""
    by_requester: dict[str, deque[QueuedRequest]] = field(default_factory=dict)
    waiting_of: dict[str, int] = field(default_factory=dict)
    """Live waiting requests per requester (0 or absent: not backlogged)."""
    heap: list[tuple[float, int, str]] = field(default_factory=list)
    """(counter when pushed, version, requester) of backlogged requesters."""
    version: dict[str, int] = field(default_factory=dict)
    """The version of each requester's one valid heap item."""
    last_counter: float = 0.0
    """Counter of the requester served last (lift target when nobody is backlogged)."""


def _clean(queue: deque[QueuedRequest], *, resumed: bool) -> QueuedRequest | None:
    """Drop requests that left this queue from its head; return the head."""
    while queue and not (queue[0].waiting and queue[0].resumed is resumed):
        queue.popleft()
    return queue[0] if queue else None


class RunState:
    """Waiting and running requests of one server, their counters and the share ledger."""

    def __init__(self, settings: SchedulerSettings) -> None:
        """Start empty, for the lanes ``settings`` lists (they cannot change afterwards)."""
        self.settings = settings
        self.lanes = check_lanes(settings.lanes)
        """The lanes, in order of service."""
        self.position = {lane: index for index, lane in enumerate(self.lanes)}
        """Each lane's place in that order (0 first): aging climbs these places."""
        self.urgent_lanes = tuple(lane for lane in self.lanes if lane.urgent)
        self.foreground_lanes = tuple(lane for lane in self.lanes if lane.foreground)
        self.yielding_lanes = tuple(lane for lane in self.lanes if lane.yields)
        self.other_lanes = tuple(
            lane for lane in self.lanes if not (lane.foreground or lane.yields)
        )
        """Neither foreground nor yielding (automation): they may not take the headroom."""
        self.counters = VirtualCounters(self.lanes)
        self.share = ShareLedger(settings.share_window_s)
        self._lanes = {lane: _LaneQueue() for lane in self.lanes}
        self._arrival_order: deque[QueuedRequest] = deque()
        """Every waiting request in arrival order, resumed ones first; removal is lazy."""
        self._expiry: list[tuple[float, int, QueuedRequest]] = []
        self._version = 0
        self.waiting = 0
        self.in_flight = 0
        self.prompt_in_flight = 0
        """Prompt tokens of the running requests."""
        self.prefill_in_flight = 0
        """Prompt tokens of the running requests the server is still prefilling (no token yet):
        what the prefill budget bounds."""
        self.stepping_prefill = 0
        """Of those, the prompts being prefilled in steps: they pause while an urgent lane is
        active, so an urgent request's room in the budget does not count them."""
        self.prefilling_count = 0
        """Running requests with no token yet; of them ``stepping_count`` prefilled in steps."""
        self.stepping_count = 0
        self.steps_paused = False
        """Whether prompts prefilled in steps are paused now (an urgent lane is active)."""
        self.queued_by_lane = dict.fromkeys(self.lanes, 0)
        """Waiting requests per lane."""
        self.running_by_lane = dict.fromkeys(self.lanes, 0)
        self.running: dict[int, QueuedRequest] = {}
        self.started_total = 0
        self.released_total = 0
        self.launches = 0
        """Tasks sent to the server (admissions and prefill steps): a gap that spans one may
        hold a stall of the server's loop (a launch can copy slots to its host prompt cache)."""

    # --- settings -------------------------------------------------------------------------------

    def update_settings(self, settings: SchedulerSettings) -> None:
        """Apply new settings; waiting requests get expiry times from the new lane limits."""
        if check_lanes(settings.lanes) != self.lanes:
            raise ValueError("a scheduler's lanes cannot change")
        self.settings = settings
        self.share.window_s = settings.share_window_s
        self._expiry = []
        for queue in self._lanes.values():
            for request in (*queue.resumed, *queue.arrivals):
                if request.waiting:
                    self._set_expiry(request)

    def queued(self, lane: Lane) -> int:
        """Count the requests waiting in a lane."""
        return self.queued_by_lane[lane]

    def busy(self, lanes: tuple[Lane, ...]) -> bool:
        """Whether any of ``lanes`` has a request waiting or running."""
        queued, running = self.queued_by_lane, self.running_by_lane
        # A loop, not any() over a generator: this runs on every decision.
        for lane in lanes:  # noqa: SIM110
            if queued[lane] or running[lane]:
                return True
        return False

    def running_in(self, lanes: tuple[Lane, ...]) -> int:
        """Count the requests of ``lanes`` in flight."""
        running = self.running_by_lane
        count = 0
        for lane in lanes:
            count += running[lane]
        return count

    def queued_in(self, lanes: tuple[Lane, ...]) -> int:
        """Count the requests of ``lanes`` waiting."""
        queued = self.queued_by_lane
        count = 0
        for lane in lanes:
            count += queued[lane]
        return count

    # --- queue changes ----------------------------------------------------------------------------

    def push(self, request: QueuedRequest) -> None:
        """Queue a new request at the back of its lane (lifting its requester's counter if idle)."""
        queue = self._lanes[request.lane]
        request.waiting = True
        requester = request.requester
        waiting = queue.waiting_of.get(requester, 0)
        if waiting == 0:
            self._lift(request.lane, queue, requester)
            self._version += 1
            queue.version[requester] = self._version
            heapq.heappush(
                queue.heap,
                (self.counters.lane(request.lane)[requester], self._version, requester),
            )
        queue.waiting_of[requester] = waiting + 1
        fifo = queue.by_requester.get(requester)
        if fifo is None:
            fifo = queue.by_requester[requester] = deque()
        fifo.append(request)
        queue.arrivals.append(request)
        self._arrival_order.append(request)
        self.queued_by_lane[request.lane] += 1
        self.waiting += 1
        self._set_expiry(request)

    def requeue_front(self, request: QueuedRequest, now: float) -> None:
        """Put a preempted request back at the head of its lane."""
        queue = self._lanes[request.lane]
        request.waiting = True
        request.resumed = True
        request.enqueued_at = now
        queue.resumed.append(request)
        self._arrival_order.appendleft(request)
        self.queued_by_lane[request.lane] += 1
        self.waiting += 1
        self._set_expiry(request)

    def remove(self, request: QueuedRequest) -> None:
        """Take a request out of the queue (admitted, cancelled or timed out); removal is lazy."""
        if not request.waiting:
            return
        request.waiting = False
        queue = self._lanes[request.lane]
        self.queued_by_lane[request.lane] -= 1
        self.waiting -= 1
        self._trim(queue)
        if request.resumed:
            return
        requester = request.requester
        left = queue.waiting_of[requester] - 1
        if left:
            queue.waiting_of[requester] = left
        else:
            del queue.waiting_of[requester]
            del queue.version[requester]
            del queue.by_requester[requester]

    def _trim(self, queue: _LaneQueue) -> None:
        """Drop departed requests from the heads of the lazy structures, so memory stays bounded."""
        self.first_waiting()  # drops the departed head of the arrival order
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

    def pop_expired(self, now: float) -> list[QueuedRequest]:
        """Remove and return the waiting requests whose wait limit has passed."""
        expired: list[QueuedRequest] = []
        # ``remove`` may rebuild the heap, so it is read afresh on every round.
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, _, request = heapq.heappop(self._expiry)
            if request.waiting and request.expires_at == expires_at:
                self.remove(request)
                expired.append(request)
        return expired

    def next_expiry(self) -> float | None:
        """When the next waiting request times out, if any waits."""
        heap = self._expiry
        while heap and (not heap[0][2].waiting or heap[0][2].expires_at != heap[0][0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # --- running requests ----------------------------------------------------------------------------

    def start(self, request: QueuedRequest, rank: float | None = None) -> None:
        """Admit a request the policy chose: it leaves the queue and takes its slot.

        ``rank`` is what the policy admitted it at (its lane's when not given).
        """
        self.remove(request)
        request.admitted_rank = (
            float(self.position[request.lane]) if rank is None else rank
        )
        self._lanes[request.lane].last_counter = self.counters.lane(request.lane).get(
            request.requester, 0.0
        )
        request.running = True
        request.prefilling = True
        self.in_flight += 1
        self.prompt_in_flight += request.prompt_tokens
        self.prefill_in_flight += request.prompt_tokens
        self.prefilling_count += 1
        self.running_by_lane[request.lane] += 1
        self.running[request.seq] = request
        self.started_total += 1
        self.launches += 1

    def release(self, request: QueuedRequest) -> bool:
        """Free a running request's slot; return False when it held none (already released)."""
        if not request.running:
            return False
        request.running = False
        self.prefill_done(request)
        self.in_flight -= 1
        self.prompt_in_flight -= request.prompt_tokens
        self.running_by_lane[request.lane] -= 1
        del self.running[request.seq]
        self.released_total += 1
        return True

    def prefill_done(self, request: QueuedRequest) -> None:
        """Mark a running request's prompt done (the server sent its first token)."""
        if request.prefilling:
            request.prefilling = False
            self.prefill_in_flight -= request.prompt_tokens
            self.prefilling_count -= 1
        if request.stepping:
            request.stepping = False
            self.stepping_prefill -= request.prompt_tokens
            self.stepping_count -= 1

    def begin_steps(self, request: QueuedRequest) -> None:
        """Mark a running request whose prompt is prefilled in steps, until its first token."""
        if request.running and request.prefilling and not request.stepping:
            request.stepping = True
            self.stepping_prefill += request.prompt_tokens
            self.stepping_count += 1

    def task_launched(self) -> None:
        """Count a task sent to the server beside the admissions (a prefill step)."""
        self.launches += 1

    def decoding_alone(self) -> int | None:
        """Return how many sequences the server decodes now, if it prefills nothing beside them.

        None while a prompt is being prefilled: its iterations stretch every stream's gaps, which
        would teach the batch-cost curve the wrong cost. Prompts prefilled in steps and paused
        are not being prefilled.
        """
        prefilling = self.prefilling_count
        if self.steps_paused:
            prefilling -= self.stepping_count
        if prefilling:
            return None
        return self.in_flight - self.prefilling_count

    # --- what the policy reads ---------------------------------------------------------------------

    def first_waiting(self) -> QueuedRequest | None:
        """Return the earliest waiting request of all lanes (a resumed one before any other)."""
        arrivals = self._arrival_order
        while arrivals and not arrivals[0].waiting:
            arrivals.popleft()
        return arrivals[0] if arrivals else None

    def lane_heads(
        self, *, oldest: bool
    ) -> list[tuple[Lane, QueuedRequest, QueuedRequest | None]]:
        """Return each lane with waiting requests, its next request and (if asked) its oldest.

        The next request is a resumed one, else the least-served requester's oldest; the oldest is
        the longest-waiting one (a resumed one first), for aging.
        """
        heads: list[tuple[Lane, QueuedRequest, QueuedRequest | None]] = []
        queued_by_lane = self.queued_by_lane
        for lane in self.lanes:
            if not queued_by_lane[lane]:
                continue
            queue = self._lanes[lane]
            resumed = _clean(queue.resumed, resumed=True)
            if resumed is not None:
                head = resumed
            else:
                requester = self._least_served(lane, queue)
                found = _clean(queue.by_requester[requester], resumed=False)
                assert found is not None  # a backlogged requester has a waiting request
                head = found
            heads.append(
                (
                    lane,
                    head,
                    (resumed or _clean(queue.arrivals, resumed=False))
                    if oldest
                    else None,
                )
            )
        return heads

    # --- fairness counters ---------------------------------------------------------------------------

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

    def _set_expiry(self, request: QueuedRequest) -> None:
        wait = self.settings.lanes[request.lane].max_wait_s
        if request.deadline_s is not None:
            wait = min(wait, request.deadline_s)
        request.expires_at = request.enqueued_at + wait
        heapq.heappush(self._expiry, (request.expires_at, request.seq, request))
