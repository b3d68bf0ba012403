"""The scheduler: the only path from Home Assistant to one LLM server.

Contract:

    scheduler = Scheduler(backend, settings, clock=time.monotonic)
    async for chunk in scheduler.stream(chat_request, lane=Lane.VOICE, requester="user:abc"):
        ...                                  # StreamChunk; the last one has done=True and usage
    result = await scheduler.generate(chat_request, lane=Lane.AUTOMATION, requester="automation.x")
    scheduler.snapshot() -> SchedulerSnapshot
    scheduler.update_settings(settings)
    scheduler.prepare()                          # a voice command is coming: make room now
    remove = scheduler.add_listener(callback)   # callback(FinishedRequest), called once per request
    await scheduler.close()                      # every waiting/running caller gets SchedulerClosedError

What runs next is decided in ``policy.py`` from the bookkeeping of ``run_state.py``; this module
carries the decisions out. Each request is tracked by a ``ticket.Ticket``; each admitted attempt
runs in ``attempts.py``, whose pump reads the server's stream, charges the tokens
(``accounting.py``: fairness counters, background share, metrics) and hands the chunks to the
caller through the ticket's channel. A preempted request resumes on a later attempt; the caller
keeps reading the same channel, so it sees one seamless stream.

Where the server lets clients choose the slot, every attempt is placed by ``slots.py`` (prompt
caches kept warm) and long background prompts are prefilled in steps (``prefill_steps.py``). What
the scheduler learns of the foreground (``foreground.py``: the headroom it needs, an announced voice
command, and from every streamed gap the batch-cost curve of ``batch_cost.py`` and the background
limit it gives) is brought up to date before each decision. The settings live in one place, the
run state (``RunState.settings``); everything else reads them there.

Timing comes from ``clock``. Queue-wait limits are enforced whenever the scheduler decides (arrivals,
releases) and by a timer; code that drives a fake clock (tests, the simulator) calls ``tick`` after
moving it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
import contextlib
from dataclasses import replace
import itertools
import logging
import time
from typing import NotRequired, TypedDict, Unpack

from custom_components.llm_lanes.core.accounting import Accounting
from custom_components.llm_lanes.core.admission import admission
from custom_components.llm_lanes.core.attempts import Attempts
from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.batch_cost import BatchCostModel
from custom_components.llm_lanes.core.errors import (
    QueueTimeoutError,
    SchedulerClosedError,
)
from custom_components.llm_lanes.core.foreground import Foreground
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import (
    Answer,
    ChatRequest,
    StreamChunk,
    TokenUsage,
)
from custom_components.llm_lanes.core.policy import Preempt, create_policy
from custom_components.llm_lanes.core.prefill_steps import PrefillSteps
from custom_components.llm_lanes.core.quota_prompts import QuotaPrompt, QuotaPrompts
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.run_state import QueuedRequest, RunState
from custom_components.llm_lanes.core.server_load import ServerLoad
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.slots import SlotPlacer
from custom_components.llm_lanes.core.snapshot import (
    FinishedRequest,
    GenerateResult,
    SchedulerSnapshot,
    build_snapshot,
)
from custom_components.llm_lanes.core.ticket import Ticket
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens

_LOGGER = logging.getLogger(__name__)

type Listener = Callable[[FinishedRequest], None]


class Submission(TypedDict):
    """What a caller says of a request besides the request itself."""

    lane: Lane
    requester: str
    prompt_tokens: NotRequired[int | None]
    """The prompt's size when the caller knows it (None: estimated from the request)."""
    deadline_s: NotRequired[float | None]
    """Bounds the wait for admission (seconds from submission) when tighter than the lane's."""


DEFAULT_WINDOW_S = 300.0
"""Sliding window of the metrics in snapshots."""
PREPARE_HOLD_S = 10.0
"""How long an announced voice command keeps room made for it (speech-to-text takes seconds)."""


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
        quotas: QuotaLedger | None = None,
    ) -> None:
        """Create a scheduler for one backend; nothing is sent until a request arrives.

        ``window_s`` is the sliding window of the snapshot's metrics. ``clock_rate`` is how many
        ``clock`` seconds pass per event-loop second (a simulator's time scale), so the wait-limit
        timer fires on time. ``quotas``: the household's ledger, shared by a pool's members.
        """
        self._backend = backend
        settings = settings if settings is not None else SchedulerSettings()
        self._clock = clock if clock is not None else time.monotonic
        self._window_s = window_s
        self._clock_rate = clock_rate if clock_rate > 0 else 1.0
        self._state = RunState(settings)
        self._policy = create_policy(settings.policy)
        self._tickets: dict[int, Ticket] = {}
        self._seq = itertools.count(1)
        self._listeners: list[Listener] = []
        self._slots = SlotPlacer(backend)
        self._quota_prompts = QuotaPrompts(backend)
        self._foreground = Foreground(settings.max_sequences, self._slots)
        self._slots.resize(settings, self._foreground.headroom.slots)
        self._accounting = Accounting(
            self._state, window_s=window_s, cost_model=self._foreground.cost_model
        )
        if quotas is not None:
            self._accounting.quotas = quotas
        self._attempts = Attempts(
            backend=backend,
            state=self._state,
            slots=self._slots,
            prefill=PrefillSteps(backend, self._clock),
            accounting=self._accounting,
            clock=self._clock,
            dispatch=self._dispatch,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._dispatching = False
        self._closed = False

    # --- public API ------------------------------------------------------------------------------

    @property
    def settings(self) -> SchedulerSettings:
        """The settings in force."""
        return self._state.settings

    def update_settings(self, settings: SchedulerSettings) -> None:
        """Apply new settings at once (waiting requests are re-ordered and may be admitted).

        The lanes stay those the scheduler was made with (ValueError otherwise).
        """
        self._state.update_settings(settings)
        self._policy = create_policy(settings.policy)
        self._slots.resize(settings, self._foreground.headroom.slots)
        self._dispatch()

    def prepare(
        self, lane: Lane = Lane.VOICE, *, within_s: float = PREPARE_HOLD_S
    ) -> None:
        """Make room for a voice command announced before its text (a wake word was heard).

        For ``within_s`` seconds (or until the command arrives) the scheduler acts as if voice
        were waiting: long background prompts wait, background prefills and the streams beyond the
        learned limit make way. Only urgent lanes need preparing.
        """
        if not lane.urgent or self._closed or not self.settings.announcements:
            return
        self._foreground.prepare(self._clock(), within_s)
        self._dispatch()

    @property
    def load(self) -> ServerLoad:
        """A read-only view of the queues, slots and learned costs (what a pool routes by)."""
        return ServerLoad(
            self._state, self._foreground, self._slots, self._attempts.prefill.cost
        )

    @property
    def quotas(self) -> QuotaLedger:
        """The ledger this scheduler charges (in a pool, the household's)."""
        return self._accounting.quotas

    @property
    def batch_cost(self) -> BatchCostModel:
        """The learned curve of inter-token gap against sequences in flight."""
        return self._foreground.cost_model

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
        sink: list[FinishedRequest] | None = None,
        **how: Unpack[Submission],
    ) -> AsyncGenerator[StreamChunk]:
        """Queue a request and stream its answer once admitted.

        Limits are checked when iteration starts, before anything is sent. Closing the iterator
        early (or cancelling the task) frees the slot or queue place at once. Its finished record
        goes to ``sink`` too (a pool reads it).
        """
        return self._run(request, sink, how)

    async def generate(
        self, request: ChatRequest, **how: Unpack[Submission]
    ) -> GenerateResult:
        """Run a request to the end and collect its answer."""
        sink: list[FinishedRequest] = []
        chunks_of = self._run(request, sink, how)
        async with contextlib.aclosing(chunks_of) as chunks:
            answer = Answer.of([chunk async for chunk in chunks])
        record = sink[0]
        return GenerateResult(
            text=answer.text,
            tool_calls=answer.tool_calls,
            finish_reason=answer.finish_reason,
            usage=answer.usage
            or TokenUsage(record.prompt_tokens, record.output_tokens, "estimate"),
            finished=record,
        )

    def snapshot(self) -> SchedulerSnapshot:
        """Return the scheduler's state and its sliding-window metrics as immutable values."""
        return build_snapshot(
            self._clock(),
            settings=self._state.settings,
            window_s=self._window_s,
            state=self._state,
            live=(ticket.queued for ticket in self._tickets.values()),
            lane_stats=self._accounting.lane_stats,
            requester_stats=self._accounting.requester_stats,
            quotas=self._accounting.quotas,
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
            self._attempts.leave(ticket, stop=True)
            ticket.channel.fail(SchedulerClosedError())
        if pumps := self._attempts.pumps:
            await asyncio.gather(*pumps, return_exceptions=True)

    # --- one request, from the caller's side -------------------------------------------------------

    async def _run(
        self,
        request: ChatRequest,
        sink: list[FinishedRequest] | None,
        how: Submission,
    ) -> AsyncGenerator[StreamChunk]:
        """Submit the request when iteration starts, then hand over its chunks.

        The prompt of a requester with a quota is counted by the server first (or bounded:
        ``quota_prompts.py``); nobody else waits for anything before submission.
        """
        prompt = how.get("prompt_tokens")
        if prompt is None:
            prompt = estimate_prompt_tokens(request)
        quota_prompt = None
        requester = how["requester"]
        if self._state.settings.quota_for(requester) > 0 and not self._closed:
            quota_prompt = await self._quota_prompts.reserve(request, requester, prompt)
        ticket = self._submit(request, sink, how, prompt, quota_prompt)
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
        sink: list[FinishedRequest] | None,
        how: Submission,
        prompt: int,
        quota_prompt: QuotaPrompt | None,
    ) -> Ticket:
        """Check the limits and the quota, then queue the request (or raise, nothing sent).

        ``generate`` passes the ``sink`` its finished record goes to. ``quota_prompt``: what
        the prompt reserves of a quota (None: bounded here where the requester has one).
        """
        if self._loop is None:
            self._loop = self._attempts.loop = asyncio.get_running_loop()
        now = self._clock()
        seq = next(self._seq)
        settings = self._state.settings
        lane, requester = how["lane"], how["requester"]
        if quota_prompt is None:
            quota_prompt = (
                self._quota_prompts.bounded(request, requester, prompt)
                if settings.quota_for(requester) > 0
                else QuotaPrompt(prompt, counted=False)
            )
        max_tokens = (
            request.max_tokens
            if request.max_tokens is not None
            else settings.lanes[lane].default_output_tokens
        )
        run_lane, error = (
            (lane, SchedulerClosedError())
            if self._closed
            else admission(
                settings,
                self._state,
                self._accounting.quotas,
                lane=lane,
                requester=requester,
                prompt_tokens=prompt,
                output_tokens=max_tokens,
                now=now,
                quota_prompt=quota_prompt,
            )
        )
        ticket = Ticket(
            queued=QueuedRequest(
                seq=seq,
                lane=run_lane,
                requester=requester,
                prompt_tokens=prompt,
                enqueued_at=now,
                deadline_s=how.get("deadline_s"),
            ),
            request=replace(request, max_tokens=max_tokens, priority=run_lane.rank),
            counters=self._state.counters.lane(run_lane),
            lane_stats=self._accounting.lane_stats[run_lane],
            requester_stats=self._accounting.stats_of(requester),
            sink=sink,
            keys=self._slots.keys_for(request),
        )
        if error is not None:
            self._accounting.count_rejected(ticket)
            limits = settings.lanes[run_lane]
            self._emit(
                ticket.finished(now, "rejected", type(error).__name__, limits), sink
            )
            raise error
        ticket.reserved = quota_prompt.tokens + max_tokens
        if quota_prompt.counted:
            ticket.counted_prompt = quota_prompt.tokens
        self._accounting.quotas.reserve(requester, ticket.reserved)
        if self._foreground.arrived(self._state, lane, prompt):
            self._slots.resize(settings, self._foreground.headroom.slots)
        self._tickets[seq] = ticket
        self._state.push(ticket.queued)
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
            state = self._state
            for queued in state.pop_expired(now):
                expired = self._tickets[queued.seq]
                if expired.admitted_at is None:
                    expired.left_queue_at = now
                expired.channel.fail(
                    QueueTimeoutError(
                        lane=queued.lane.key, waited_s=now - queued.enqueued_at
                    )
                )
            foreground = self._foreground
            foreground.before_decisions(state, now)
            admitted: set[int] = set()
            while (decision := self._policy.choose(state, foreground, now)) is not None:
                if isinstance(decision, Preempt):
                    seq = decision.victim.seq
                    if seq in admitted:
                        # Admitting and preempting the same request in one round would go on
                        # for ever: a policy bug, stopped here rather than hanging the loop.
                        _LOGGER.error(
                            "policy loop on request %s; decisions stopped", seq
                        )
                        break
                    self._attempts.preempt(self._tickets[seq], now)
                else:
                    admitted.add(decision.request.seq)
                    self._attempts.start(
                        self._tickets[decision.request.seq], now, decision.rank
                    )
            quiet = self._attempts.urgent_quiet
            state.steps_paused = foreground.urgent_active(state, now)
            if state.steps_paused:
                quiet.clear()
            else:
                quiet.set()
        finally:
            self._dispatching = False
        self._arm_timer()

    def _arm_timer(self) -> None:
        when = self._state.next_expiry()
        expected = self._foreground.announced_until
        if expected > self._clock() and (when is None or expected < when):
            when = (
                expected  # an announced command that did not come: let background go on
            )
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

    # --- the end of a request ---------------------------------------------------------------------------

    def _finish(self, ticket: Ticket, outcome: str, error: str | None) -> None:
        """Release whatever the request still holds and report it, exactly once."""
        if ticket.record is not None:
            return
        now = self._clock()
        queued = ticket.queued
        self._attempts.leave(ticket, stop=outcome != "ok")
        del self._tickets[queued.seq]
        record = ticket.record = ticket.finished(
            now, outcome, error, self._state.settings.lanes[queued.lane]
        )
        self._accounting.charge_finished(ticket, record, now)
        if (
            ticket.usage_prompt is not None
            and self._state.settings.quota_for(queued.requester) > 0
        ):
            self._quota_prompts.learn(
                ticket.request,
                queued.requester,
                ticket.original_prompt,
                ticket.usage_prompt,
            )
        self._emit(record, ticket.sink)
        self._dispatch()

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
