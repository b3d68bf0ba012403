"""The scheduler: the only path from Home Assistant to one LLM server.

Contract:

    scheduler = Scheduler(backend, settings, clock=time.monotonic)
    async for chunk in scheduler.stream(chat_request, lane=Lane.VOICE, requester="user:abc"):
        ...                                  # StreamChunk; the last one has done=True and usage
    result = await scheduler.generate(chat_request, lane=Lane.AUTOMATION, requester="automation.x")
    scheduler.snapshot() -> SchedulerSnapshot
    scheduler.update_settings(settings)
    remove = scheduler.add_listener(callback)   # callback(FinishedRequest), called once per request
    await scheduler.close()                      # every waiting/running caller gets SchedulerClosedError

What runs next is decided in ``policy.py``; this module carries the decisions out. Each admitted
attempt gets a *pump* task that reads the backend's stream, charges the tokens (fairness counters,
background share, metrics) and hands the chunks to the caller through a channel. Preempting a stream
cancels its pump (which closes the backend stream, cancelling it at the server) and requeues the
request; its next pump sends the kept text back as an assistant prefix, and the caller keeps reading
the same channel, so it sees one seamless stream.

Timing comes from ``clock``. Queue-wait limits are enforced whenever the scheduler decides (arrivals,
releases) and by a timer; code that drives a fake clock (tests, the simulator) calls ``tick`` after
moving it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Callable
import contextlib
from dataclasses import replace
import itertools
import logging
import time

from .backends.base import Backend, ChatRequest, StreamChunk, TokenUsage, ToolCall
from .errors import (
    LanesError,
    LimitExceededError,
    QueueFullError,
    QueueTimeoutError,
    QuotaExceededError,
    SchedulerClosedError,
    StreamClosedError,
)
from .lanes import Lane
from .metrics import GroupStats, request_itl_p95
from .policy import Entry, Preempt, RunQueue
from .quotas import QuotaLedger
from .settings import QuotaAction, SchedulerSettings
from .snapshot import (
    FinishedRequest,
    GenerateResult,
    LaneSnapshot,
    RequesterSnapshot,
    SchedulerSnapshot,
)
from .tokens import estimate_prompt_tokens

_LOGGER = logging.getLogger(__name__)

type Listener = Callable[[FinishedRequest], None]

DEFAULT_WINDOW_S = 300.0
"""Sliding window of the metrics in snapshots."""
REQUESTER_MAX_SAMPLES = 1_000
"""Samples kept per requester and window (lanes keep more), so snapshots stay cheap with many."""


class _Channel:
    """Chunks (or a backend error) from the pumps to the caller, in order; ``fail`` jumps the line."""

    __slots__ = ("_error", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[StreamChunk | BaseException] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    def put(self, item: StreamChunk | BaseException) -> None:
        self._items.append(item)
        self._wake()

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> StreamChunk:
        while True:
            if self._error is not None:
                raise self._error
            if self._items:
                item = self._items.popleft()
                if isinstance(item, BaseException):
                    raise item
                return item
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None


class _Ticket:
    """Everything the scheduler tracks about one request between submission and its end."""

    __slots__ = (
        "admitted_at",
        "arrived_at",
        "attempt_live",
        "attempt_output",
        "attempt_prompt",
        "attempts",
        "channel",
        "counters",
        "entry",
        "first_token_at",
        "left_queue_at",
        "gaps",
        "lane_stats",
        "last_token_at",
        "original_prompt",
        "output_adjust",
        "parts",
        "preemptions",
        "pump",
        "record",
        "request",
        "requester_stats",
        "sink",
        "token_source",
        "usage_prompt",
    )

    def __init__(
        self,
        *,
        entry: Entry,
        request: ChatRequest,
        counters: dict[str, float],
        lane_stats: GroupStats,
        requester_stats: GroupStats,
        sink: list[FinishedRequest] | None,
    ) -> None:
        self.entry = entry
        self.request = request
        self.arrived_at = entry.enqueued_at
        self.original_prompt = entry.prompt_tokens
        self.counters = counters
        self.lane_stats = lane_stats
        self.requester_stats = requester_stats
        self.sink = sink
        self.channel = _Channel()
        self.admitted_at: float | None = None
        self.left_queue_at: float | None = None
        """When it timed out of the queue (its wait ends there, not when the caller notices)."""
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.gaps: list[float] = []
        self.parts: list[str] = []
        self.attempts = 0
        self.attempt_live: int | None = None
        self.attempt_prompt = 0
        self.attempt_output = 0
        self.output_adjust = 0
        self.usage_prompt: int | None = None
        self.token_source = "estimate"
        self.preemptions = 0
        self.pump: asyncio.Task[None] | None = None
        self.record: FinishedRequest | None = None


class Scheduler:
    """Priority scheduler in front of one LLM server (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        settings: SchedulerSettings | None = None,
        *,
        clock: Callable[[], float] | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        clock_rate: float = 1.0,
    ) -> None:
        """Create a scheduler for one backend; nothing is sent until a request arrives.

        ``window_s`` is the sliding window of the snapshot's metrics. ``clock_rate`` is how many
        ``clock`` seconds pass per event-loop second (a simulator's time scale), so the wait-limit
        timer fires on time.
        """
        self._backend = backend
        self._settings = settings if settings is not None else SchedulerSettings()
        self._clock = clock if clock is not None else time.monotonic
        self._window_s = window_s
        self._clock_rate = clock_rate if clock_rate > 0 else 1.0
        self._queue = RunQueue(self._settings)
        self._w_in = self._settings.input_weight
        self._w_out = self._settings.output_weight
        self._tickets: dict[int, _Ticket] = {}
        self._seq = itertools.count(1)
        self._listeners: list[Listener] = []
        self._lane_stats = {lane: GroupStats() for lane in Lane}
        self._requester_stats: dict[str, GroupStats] = {}
        self._quotas = QuotaLedger()
        self._pumps: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._dispatching = False
        self._closed = False

    # --- public API ------------------------------------------------------------------------------

    @property
    def settings(self) -> SchedulerSettings:
        """The settings in force."""
        return self._settings

    def update_settings(self, settings: SchedulerSettings) -> None:
        """Apply new settings at once (waiting requests are re-ordered and may be admitted)."""
        self._settings = settings
        self._w_in = settings.input_weight
        self._w_out = settings.output_weight
        self._queue.update_settings(settings)
        self._dispatch()

    def add_listener(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback`` once for every request that leaves the scheduler; return a remover."""
        self._listeners.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(callback)

        return remove

    def stream(
        self,
        request: ChatRequest,
        *,
        lane: Lane,
        requester: str,
        prompt_tokens: int | None = None,
        deadline_s: float | None = None,
    ) -> AsyncGenerator[StreamChunk]:
        """Queue a request and stream its answer once admitted.

        Limits are checked when iteration starts, before anything is sent. ``deadline_s`` bounds the
        wait for admission (in seconds from submission) when tighter than the lane's max wait.
        Closing the iterator early (or cancelling the task) frees the slot or queue place at once.
        """
        return self._run(
            request,
            lane=lane,
            requester=requester,
            prompt_tokens=prompt_tokens,
            deadline_s=deadline_s,
            sink=None,
        )

    async def generate(
        self,
        request: ChatRequest,
        *,
        lane: Lane,
        requester: str,
        prompt_tokens: int | None = None,
        deadline_s: float | None = None,
    ) -> GenerateResult:
        """Run a request to the end and collect its answer."""
        sink: list[FinishedRequest] = []
        parts: list[str] = []
        tool_calls: list[ToolCall] = []
        finish_reason: str | None = None
        usage: TokenUsage | None = None
        async with contextlib.aclosing(
            self._run(
                request,
                lane=lane,
                requester=requester,
                prompt_tokens=prompt_tokens,
                deadline_s=deadline_s,
                sink=sink,
            )
        ) as chunks:
            async for chunk in chunks:
                parts.append(chunk.text)
                tool_calls.extend(chunk.tool_calls)
                if chunk.done:
                    finish_reason = chunk.finish_reason
                    usage = chunk.usage
        record = sink[0]
        return GenerateResult(
            text="".join(parts),
            tool_calls=tuple(tool_calls),
            finish_reason=finish_reason,
            usage=usage
            or TokenUsage(record.prompt_tokens, record.output_tokens, "estimate"),
            finished=record,
        )

    def tick(self) -> None:
        """Time out requests that waited too long and admit what now fits.

        Runs on a timer; code that drives a fake clock calls it after moving the clock.
        """
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None
        self._dispatch()

    async def close(self) -> None:
        """Fail every waiting and running request with SchedulerClosedError and stop all streams."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for ticket in list(self._tickets.values()):
            entry = ticket.entry
            self._queue.remove(entry)
            self._queue.release(entry)
            ticket.attempt_live = None
            if ticket.pump is not None:
                ticket.pump.cancel()
            ticket.channel.fail(SchedulerClosedError())
        if self._pumps:
            await asyncio.gather(*self._pumps, return_exceptions=True)

    # --- one request, from the caller's side -------------------------------------------------------

    async def _run(
        self,
        request: ChatRequest,
        *,
        lane: Lane,
        requester: str,
        prompt_tokens: int | None,
        deadline_s: float | None,
        sink: list[FinishedRequest] | None,
    ) -> AsyncGenerator[StreamChunk]:
        ticket = self._submit(
            request,
            lane=lane,
            requester=requester,
            prompt_tokens=prompt_tokens,
            deadline_s=deadline_s,
            sink=sink,
        )
        outcome = "cancelled"
        error: str | None = None
        try:
            while True:
                item = await ticket.channel.get()
                if item.done:
                    self._finish(ticket, "ok", None)
                yield item
                if item.done:
                    return
        except SchedulerClosedError:
            error = SchedulerClosedError.__name__
            raise
        except Exception as err:
            outcome, error = "error", type(err).__name__
            raise
        finally:
            self._finish(ticket, outcome, error)

    def _submit(
        self,
        request: ChatRequest,
        *,
        lane: Lane,
        requester: str,
        prompt_tokens: int | None,
        deadline_s: float | None,
        sink: list[FinishedRequest] | None,
    ) -> _Ticket:
        """Check the limits and the quota, then queue the request (or raise, nothing sent)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        now = self._clock()
        settings = self._settings
        seq = next(self._seq)
        limits = settings.lanes[lane]
        prompt = (
            prompt_tokens
            if prompt_tokens is not None
            else estimate_prompt_tokens(request)
        )
        max_tokens = (
            request.max_tokens
            if request.max_tokens is not None
            else limits.default_output_tokens
        )
        error: LanesError | None = None
        run_lane = lane
        if self._closed:
            error = SchedulerClosedError()
        elif max_tokens > limits.max_output_tokens:
            error = LimitExceededError(
                lane=lane.key,
                limit="max_output_tokens",
                value=max_tokens,
                maximum=limits.max_output_tokens,
            )
        elif prompt > limits.max_prompt_tokens:
            error = LimitExceededError(
                lane=lane.key,
                limit="max_prompt_tokens",
                value=prompt,
                maximum=limits.max_prompt_tokens,
            )
        else:
            quota = settings.quota_for(requester)
            used = self._quotas.used(requester, now) if quota > 0 else 0
            if quota > 0 and used >= quota:
                if settings.quota_action is QuotaAction.REJECT:
                    error = QuotaExceededError(
                        requester=requester, used=used, quota=quota
                    )
                else:
                    run_lane = Lane.BACKGROUND
            if error is None and self._queue.queued(run_lane) >= (
                settings.lanes[run_lane].max_queued
            ):
                error = QueueFullError(
                    lane=run_lane.key, max_queued=settings.lanes[run_lane].max_queued
                )
        if error is not None:
            self._reject(
                seq,
                lane=run_lane,
                requester=requester,
                prompt=prompt,
                error=error,
                sink=sink,
            )
            raise error
        entry = Entry(
            seq=seq,
            lane=run_lane,
            requester=requester,
            prompt_tokens=prompt,
            enqueued_at=now,
            deadline_s=deadline_s,
        )
        ticket = _Ticket(
            entry=entry,
            request=replace(request, max_tokens=max_tokens, priority=int(run_lane)),
            counters=self._queue.counters.lane(run_lane),
            lane_stats=self._lane_stats[run_lane],
            requester_stats=self._stats_of(requester),
            sink=sink,
        )
        self._tickets[seq] = ticket
        self._queue.push(entry)
        self._dispatch()
        return ticket

    # --- decisions -----------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Expire overdue waiters, then carry out the policy's decisions until it says wait."""
        if self._dispatching or self._closed:
            return
        self._dispatching = True
        try:
            now = self._clock()
            for entry in self._queue.pop_expired(now):
                expired = self._tickets[entry.seq]
                if expired.admitted_at is None:
                    expired.left_queue_at = now
                expired.channel.fail(
                    QueueTimeoutError(
                        lane=entry.lane.key, waited_s=now - entry.enqueued_at
                    )
                )
            while (decision := self._queue.choose(now)) is not None:
                if isinstance(decision, Preempt):
                    self._preempt(self._tickets[decision.victim.seq], now)
                else:
                    self._start(self._tickets[decision.entry.seq], now)
        finally:
            self._dispatching = False
        self._arm_timer()

    def _arm_timer(self) -> None:
        when = self._queue.next_expiry()
        if when == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None
        if when is None or self._loop is None or self._closed:
            return
        delay = max(0.0, when - self._clock()) / self._clock_rate
        self._timer = self._loop.call_later(delay, self.tick)
        self._timer_at = when

    def _start(self, ticket: _Ticket, now: float) -> None:
        """Admit a request: take its slot, charge its prompt, start the pump for this attempt."""
        entry = ticket.entry
        self._queue.start(entry)
        ticket.attempts += 1
        ticket.attempt_live = ticket.attempts
        if ticket.admitted_at is None:
            ticket.admitted_at = now
        ticket.attempt_prompt = entry.prompt_tokens
        ticket.attempt_output = 0
        weight = self._w_in * entry.prompt_tokens
        ticket.counters[entry.requester] += weight
        self._queue.share.add(now, weight, background=entry.lane is Lane.BACKGROUND)
        ticket.lane_stats.prompt_rate.add(now, entry.prompt_tokens, self._window_s)
        ticket.requester_stats.prompt_rate.add(now, entry.prompt_tokens, self._window_s)
        request = ticket.request
        if ticket.preemptions:
            assert request.max_tokens is not None  # set at submission
            remaining = request.max_tokens - entry.output_tokens
            if remaining <= 0:
                # Preempted right after its last token: nothing is left to generate.
                self._queue.release(entry)
                ticket.attempt_live = None
                ticket.channel.put(
                    self._complete(
                        ticket, StreamChunk(done=True, finish_reason="length")
                    )
                )
                return
            request = replace(
                request,
                assistant_prefix=request.assistant_prefix + "".join(ticket.parts),
                max_tokens=remaining,
            )
        assert self._loop is not None  # set by the first submission
        task = self._loop.create_task(
            self._pump(ticket, ticket.attempts, request),
            name=f"llm_lanes pump {entry.seq}",
        )
        ticket.pump = task
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

    def _preempt(self, ticket: _Ticket, now: float) -> None:
        """Cancel a background stream at the server, keep its output and requeue it at the head."""
        entry = ticket.entry
        self._queue.release(entry)
        ticket.attempt_live = None
        if ticket.pump is not None:
            ticket.pump.cancel()
            ticket.pump = None
        ticket.preemptions += 1
        ticket.lane_stats.preemptions_total += 1
        ticket.requester_stats.preemptions_total += 1
        # The kept output is prompt for the next attempt.
        entry.prompt_tokens = ticket.original_prompt + entry.output_tokens
        self._queue.requeue_front(entry, now)
        _LOGGER.debug(
            "preempted request %s after %s tokens", entry.seq, entry.output_tokens
        )

    def _release_slot(self, ticket: _Ticket) -> None:
        if self._queue.release(ticket.entry):
            ticket.attempt_live = None
            self._dispatch()

    # --- the server's side ---------------------------------------------------------------------------

    async def _pump(self, ticket: _Ticket, attempt: int, request: ChatRequest) -> None:
        """Read one attempt's stream from the server into the caller's channel."""
        stream: AsyncGenerator[StreamChunk] | None = None
        try:
            iterator = self._backend.chat(request)
            if isinstance(iterator, AsyncGenerator):
                stream = iterator
            async for chunk in iterator:
                if ticket.attempt_live != attempt:
                    return
                self._account(ticket, chunk, self._clock())
                if chunk.done:
                    final = self._complete(ticket, chunk)
                    self._release_slot(ticket)
                    ticket.channel.put(final)
                    return
                ticket.channel.put(chunk)
            if ticket.attempt_live == attempt:
                self._release_slot(ticket)
                ticket.channel.put(
                    StreamClosedError(
                        "the server closed the stream before it said it was done"
                    )
                )
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - handed to the caller, typed and unchanged
            if ticket.attempt_live == attempt:
                self._release_slot(ticket)
                ticket.channel.put(err)
        finally:
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()

    def _account(self, ticket: _Ticket, chunk: StreamChunk, now: float) -> None:
        """Charge one streamed chunk: fairness counter, background share, rates, gaps."""
        tokens = chunk.output_tokens
        if tokens:
            entry = ticket.entry
            entry.output_tokens += tokens
            ticket.attempt_output += tokens
            weight = tokens * self._w_out
            ticket.counters[entry.requester] += weight
            self._queue.share.add(now, weight, background=entry.lane is Lane.BACKGROUND)
            ticket.lane_stats.output_rate.add(now, tokens, self._window_s)
            ticket.requester_stats.output_rate.add(now, tokens, self._window_s)
        if tokens or chunk.text or chunk.tool_calls:
            ticket.entry.prefilling = False
            last = ticket.last_token_at
            if last is None:
                ticket.first_token_at = now
            else:
                gap = now - last
                ticket.gaps.append(gap)
                ticket.lane_stats.itl.add(now, gap)
                ticket.requester_stats.itl.add(now, gap)
            ticket.last_token_at = now
        if chunk.text:
            ticket.parts.append(chunk.text)

    def _complete(self, ticket: _Ticket, chunk: StreamChunk) -> StreamChunk:
        """Reconcile the estimates with the server's usage; give the final chunk whole-request usage."""
        usage = chunk.usage
        entry = ticket.entry
        if usage is not None and usage.source == "server":
            adjust_prompt = usage.prompt_tokens - ticket.attempt_prompt
            adjust_output = usage.output_tokens - ticket.attempt_output
            ticket.output_adjust += adjust_output
            correction = self._w_in * adjust_prompt + self._w_out * adjust_output
            if correction:
                ticket.counters[entry.requester] += correction
            ticket.token_source = "server"
            if ticket.preemptions == 0:
                ticket.usage_prompt = usage.prompt_tokens
        output = entry.output_tokens + ticket.output_adjust
        prompt = (
            ticket.usage_prompt
            if ticket.usage_prompt is not None
            else ticket.original_prompt
        )
        if usage is not None and ticket.preemptions == 0:
            return chunk
        return replace(
            chunk,
            usage=TokenUsage(
                prompt,
                output,
                "server" if ticket.token_source == "server" else "estimate",
            ),
        )

    # --- the end of a request ---------------------------------------------------------------------------

    def _finish(self, ticket: _Ticket, outcome: str, error: str | None) -> None:
        """Release whatever the request still holds and report it, exactly once."""
        if ticket.record is not None:
            return
        now = self._clock()
        entry = ticket.entry
        self._queue.remove(entry)
        self._queue.release(entry)
        ticket.attempt_live = None
        if outcome != "ok" and ticket.pump is not None and not ticket.pump.done():
            ticket.pump.cancel()
        del self._tickets[entry.seq]
        limits = self._settings.lanes[entry.lane]
        ttft = (
            None
            if ticket.first_token_at is None
            else ticket.first_token_at - ticket.arrived_at
        )
        itl_p95 = request_itl_p95(ticket.gaps)
        output = entry.output_tokens + ticket.output_adjust
        prompt = (
            ticket.usage_prompt
            if ticket.usage_prompt is not None
            else ticket.original_prompt
        )
        queue_left = now
        if ticket.admitted_at is not None:
            queue_left = ticket.admitted_at
        elif ticket.left_queue_at is not None:
            queue_left = ticket.left_queue_at
        record = FinishedRequest(
            request_id=f"{entry.seq}",
            lane=entry.lane,
            requester=entry.requester,
            outcome=outcome,
            error=error,
            queue_wait_s=queue_left - ticket.arrived_at,
            ttft_s=ttft,
            itl_p95_s=itl_p95,
            itl_max_s=max(ticket.gaps) if ticket.gaps else None,
            e2e_s=now - ticket.arrived_at,
            prompt_tokens=prompt,
            output_tokens=output,
            token_source=ticket.token_source,
            preemptions=ticket.preemptions,
            met_ttft=ttft is not None and ttft <= limits.ttft_slo_s,
            met_itl=itl_p95 is None or itl_p95 <= limits.itl_slo_s,
        )
        ticket.record = record
        if ticket.admitted_at is not None:
            self._quotas.charge(entry.requester, prompt + output, now)
        timed_out = error == QueueTimeoutError.__name__
        for stats in (ticket.lane_stats, ticket.requester_stats):
            stats.record_finished(
                now,
                counts_for_goodput=outcome in {"ok", "error"},
                good=record.met_objectives,
                queue_wait_s=record.queue_wait_s,
                ttft_s=ttft,
                e2e_s=record.e2e_s,
                prompt_tokens=prompt if ticket.admitted_at is not None else 0,
                output_tokens=output,
            )
            if timed_out:
                stats.rejected_total += 1
        self._emit(record, ticket.sink)
        self._dispatch()

    def _reject(
        self,
        seq: int,
        *,
        lane: Lane,
        requester: str,
        prompt: int,
        error: LanesError,
        sink: list[FinishedRequest] | None,
    ) -> None:
        self._lane_stats[lane].rejected_total += 1
        self._stats_of(requester).rejected_total += 1
        record = FinishedRequest(
            request_id=f"{seq}",
            lane=lane,
            requester=requester,
            outcome="rejected",
            error=type(error).__name__,
            queue_wait_s=0.0,
            ttft_s=None,
            itl_p95_s=None,
            itl_max_s=None,
            e2e_s=0.0,
            prompt_tokens=prompt,
            output_tokens=0,
            token_source="estimate",
            preemptions=0,
            met_ttft=False,
            met_itl=False,
        )
        self._emit(record, sink)

    def _emit(
        self, record: FinishedRequest, sink: list[FinishedRequest] | None
    ) -> None:
        if sink is not None:
            sink.append(record)
        for listener in tuple(self._listeners):
            try:
                listener(record)
            except Exception:
                _LOGGER.exception("listener for finished requests failed")

    def _stats_of(self, requester: str) -> GroupStats:
        stats = self._requester_stats.get(requester)
        if stats is None:
            stats = self._requester_stats[requester] = GroupStats(REQUESTER_MAX_SAMPLES)
        return stats

    # --- snapshot ---------------------------------------------------------------------------------------

    def snapshot(self) -> SchedulerSnapshot:
        """Return the scheduler's state and its sliding-window metrics as immutable values."""
        now = self._clock()
        window = self._window_s
        queue = self._queue
        lanes: dict[Lane, LaneSnapshot] = {}
        finished = good = 0
        finished_total = rejected_total = preemptions_total = 0
        output_rate = prompt_rate = 0.0
        for lane in Lane:
            stats = self._lane_stats[lane]
            view = stats.view(now, window)
            finished += view.finished_in_window
            good += view.good_in_window
            finished_total += stats.finished_total
            rejected_total += stats.rejected_total
            preemptions_total += stats.preemptions_total
            output_rate += view.output_tok_s
            prompt_rate += view.prompt_tok_s
            lanes[lane] = LaneSnapshot(
                lane=lane,
                queue_depth=queue.queued(lane),
                in_flight=queue.running_by_lane[lane],
                finished_in_window=view.finished_in_window,
                finished_total=stats.finished_total,
                rejected_total=stats.rejected_total,
                preemptions_total=stats.preemptions_total,
                ttft_p50_s=view.ttft.p50,
                ttft_p90_s=view.ttft.p90,
                ttft_p95_s=view.ttft.p95,
                ttft_p99_s=view.ttft.p99,
                itl_p50_s=view.itl.p50,
                itl_p90_s=view.itl.p90,
                itl_p95_s=view.itl.p95,
                itl_p99_s=view.itl.p99,
                e2e_p50_s=view.e2e.p50,
                e2e_p90_s=view.e2e.p90,
                e2e_p95_s=view.e2e.p95,
                e2e_p99_s=view.e2e.p99,
                queue_wait_p50_s=view.queue_wait.p50,
                queue_wait_p90_s=view.queue_wait.p90,
                queue_wait_p95_s=view.queue_wait.p95,
                queue_wait_p99_s=view.queue_wait.p99,
                goodput=view.goodput,
                good_per_s=view.good_per_s,
                prompt_tokens_total=stats.prompt_tokens_total,
                output_tokens_total=stats.output_tokens_total,
                output_tok_s=view.output_tok_s,
                prompt_tok_s=view.prompt_tok_s,
            )
        waiting: dict[str, int] = {}
        running: dict[str, int] = {}
        for ticket in self._tickets.values():
            entry = ticket.entry
            if entry.waiting:
                waiting[entry.requester] = waiting.get(entry.requester, 0) + 1
            elif entry.running:
                running[entry.requester] = running.get(entry.requester, 0) + 1
        requesters: dict[str, RequesterSnapshot] = {}
        for name in {*self._requester_stats, *self._quotas.requesters()}:
            stats = self._stats_of(name)
            view = stats.view(now, window)
            requesters[name] = RequesterSnapshot(
                requester=name,
                prompt_tokens_total=stats.prompt_tokens_total,
                output_tokens_total=stats.output_tokens_total,
                tokens_last_24h=self._quotas.used(name, now),
                virtual_counter=queue.counters.total(name),
                quota_tokens=self._settings.quota_for(name),
                queue_depth=waiting.get(name, 0),
                in_flight=running.get(name, 0),
                finished_total=stats.finished_total,
                rejected_total=stats.rejected_total,
                preemptions_total=stats.preemptions_total,
                finished_in_window=view.finished_in_window,
                queue_wait_p50_s=view.queue_wait.p50,
                queue_wait_p95_s=view.queue_wait.p95,
                ttft_p50_s=view.ttft.p50,
                ttft_p95_s=view.ttft.p95,
                itl_p50_s=view.itl.p50,
                itl_p95_s=view.itl.p95,
                e2e_p50_s=view.e2e.p50,
                e2e_p95_s=view.e2e.p95,
                goodput=view.goodput,
                output_tok_s=view.output_tok_s,
            )
        background, total = queue.share.shares(now)
        return SchedulerSnapshot(
            taken_at=now,
            settings=self._settings,
            lanes=lanes,
            requesters=requesters,
            queue_depth=queue.waiting,
            in_flight=queue.in_flight,
            prompt_tokens_in_flight=queue.prompt_in_flight,
            output_tok_s=output_rate,
            prompt_tok_s=prompt_rate,
            goodput=good / finished if finished else None,
            rejected_total=rejected_total,
            preemptions_total=preemptions_total,
            window_s=window,
            background_service_share=background / total if total > 0 else None,
            finished_total=finished_total,
        )
