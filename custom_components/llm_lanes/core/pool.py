"""The household's servers as one pool: routing, failover, wake and sleep above their schedulers.

Contract:

    pool = ServerPool(members, PoolSettings(routes={Lane.VOICE: ("gpu", "mini"), ...}), quotas=ledger)
    async for chunk in pool.stream(chat_request, lane=Lane.VOICE, requester="user:abc"):
        ...                                  # one seamless stream, whichever servers served it
    result = await pool.generate(chat_request, lane=Lane.AUTOMATION, requester="automation.x")
    pool.stream(request, lane=..., requester=..., server="gpu")   # one server only, no failover
    pool.prepare()                           # a voice command is coming
    pool.snapshot() -> PoolSnapshot
    pool.report("gpu", ServerState.ASLEEP)   # what the Home Assistant side sees of a server
    pool.report_queue("gpu", waiting)       # what the server's own metrics say waits inside it
    remove = pool.add_listener(callback)     # callback(FinishedRequest), once per pool request
    pool.is_attempt(record)                  # a member scheduler's record of one of its attempts
    await pool.update(members, settings)     # servers set up, set up again or gone; new routes
    await pool.close()

Each member is one server with its own ``Scheduler``, as a single server has: lanes, aging,
fairness, slots and preemption stay per server. What is the household's is shared: every member
scheduler is built with the pool's ``QuotaLedger`` (``Scheduler(..., quotas=ledger)``), so a
requester's daily quota counts the tokens of every server. The pool owns neither the schedulers
nor the servers: their owners close them.

Per lane, ``PoolSettings.routes`` lists the servers that may serve it, most preferred first (a
lane not listed may use every member, in the members' order; one listed with none, none). A
request goes to the server the router (``router.py``) expects it to be felt least at, among those
that are up and can serve it.
Then:

- **Failover**: a server that fails before the first token (refused connection, 5xx, timeout, its
  scheduler closing, its queue full) passes the request to the next one: the caller only sees a
  later first token. A server that fails in the middle of an answer passes what was streamed so
  far to the next one as an assistant prefix (the preemption-resume path), which continues it:
  the caller reads one stream. A server that failed is down until its health check answers
  (``availability.py``). An answer that already streamed tool calls cannot be continued and fails.
- **Urgent lanes** (voice) never wait for a server that is down, asleep or waking: with none up
  they fail at once (``NoServerError``), and a server that sends no token for ``urgent_stall_s``
  passes the command on.
- **Wake and sleep**: a request of another lane with no server up wakes one that may serve it
  (the most preferred that can wake), waits for it within its wake limit, then runs there
  (``WakeTimeoutError`` otherwise). ``prepare`` makes room at the server voice would go to, and
  wakes the servers voice prefers to it for the follow-up. A member with ``idle_sleep_s`` is put
  to sleep after its work and that many idle seconds.

Every request ends exactly once, on one server: the pool's listeners get one ``FinishedRequest``
per request, timed from its arrival at the pool, naming the ``server`` it ended on, its
``failovers``, the server it ``resumed_on`` and the ``path`` of its attempts. The member schedulers report each attempt as
usual (an attempt abandoned on a failing server is an error there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
import contextlib
import itertools
import logging
import time
from typing import Unpack

from custom_components.llm_lanes.core.availability import ServerState
from custom_components.llm_lanes.core.errors import (
    REFUSALS,
    BackendHTTPError,
    LanesError,
    LimitExceededError,
    NoServerError,
    SchedulerClosedError,
    ServerBusyError,
    StreamClosedError,
    WakeTimeoutError,
)
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.metrics import request_itl_p95
from custom_components.llm_lanes.core.model import (
    Answer,
    ChatMessage,
    ChatRequest,
    StreamChunk,
    TokenUsage,
)
from custom_components.llm_lanes.core.pool_journey import (
    MOVE_AND_MARK_DOWN,
    MOVE_ON,
    Journey,
    PoolSubmission,
)
from custom_components.llm_lanes.core.pool_members import (
    Listener,
    Member,
    PoolMember,
    PoolSettings,
    check_members,
    noting_activity,
)
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.router import (
    ANY_MODEL,
    Estimate,
    PromptShape,
    Router,
)
from custom_components.llm_lanes.core.scheduler import PREPARE_HOLD_S, Submission
from custom_components.llm_lanes.core.snapshot import (
    FinishedRequest,
    GenerateResult,
    MemberSnapshot,
    PoolSnapshot,
)

_LOGGER = logging.getLogger(__name__)


class ServerPool:
    """The household's servers as one (see the module docstring)."""

    def __init__(
        self,
        members: Sequence[PoolMember],
        settings: PoolSettings | None = None,
        *,
        quotas: QuotaLedger,
        clock: Callable[[], float] | None = None,
        clock_rate: float = 1.0,
    ) -> None:
        """Pool ``members`` (their schedulers built with ``quotas``); nothing is sent yet.

        Route names must be members' (ValueError otherwise).
        """
        settings = settings if settings is not None else PoolSettings()
        self._clock = clock if clock is not None else time.monotonic
        self._clock_rate = clock_rate
        self._settings = settings
        self.quotas = quotas
        """The household's ledger of tokens per requester (shared by the member schedulers)."""
        check_members(members, settings)
        self._members: dict[str, Member] = {}
        self._removers: dict[str, Callable[[], None]] = {}
        for config in members:
            self._join(config)
        self._router = Router(margin=settings.margin, margin_s=settings.margin_s)
        self._seq = itertools.count(1)
        self._listeners: list[Listener] = []
        self._live: dict[int, Journey] = {}
        self._requests_total = 0
        self._failovers_total = 0
        self._closed = False

    def _join(self, config: PoolMember) -> None:
        member = Member(config, self._settings, self._clock, self._clock_rate)
        self._members[config.name] = member
        self._removers[config.name] = config.scheduler.add_listener(
            noting_activity(member.availability)
        )

    # --- public API ------------------------------------------------------------------------------

    @property
    def settings(self) -> PoolSettings:
        """How the pool routes."""
        return self._settings

    def state(self, server: str) -> ServerState:
        """Return the state of one server."""
        return self._member(server).availability.state

    def report(self, server: str, state: ServerState) -> None:
        """Take what is seen of a server from outside (its polls, its sleep entity)."""
        self._member(server).availability.report(state)

    def route(self, lane: Lane) -> tuple[str, ...]:
        """Return the servers that may serve ``lane``, most preferred first.

        A lane the routes leave out may use every member; one routed to none, none.
        """
        names = self._settings.routes.get(lane)
        return names if names is not None else tuple(self._members)

    def add_listener(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback`` once for every request that leaves the pool; return a remover."""
        self._listeners.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(callback)

        return remove

    async def update(
        self, members: Sequence[PoolMember], settings: PoolSettings | None = None
    ) -> None:
        """Change the members and how the pool routes; requests in flight go on.

        A member named as before with the same scheduler keeps its state, what the router
        learned of it and its counters, and takes the new power control and capabilities; one
        with another scheduler (its server was set up again) starts afresh in its ``state``. A
        request running on a member that leaves goes on there, and fails over as usual if its
        scheduler closes under it. ``settings`` None keeps the current ones. Routes must name
        members only (ValueError otherwise, and nothing changes).
        """
        settings = settings if settings is not None else self._settings
        check_members(members, settings)
        self._settings = settings
        self._router.margin, self._router.margin_s = settings.margin, settings.margin_s
        leaving = [
            name
            for name, member in self._members.items()
            if not any(
                config.name == name and config.scheduler is member.scheduler
                for config in members
            )
        ]
        closing = []
        for name in leaving:
            self._removers.pop(name)()
            closing.append(self._members.pop(name).availability.close())
        for config in members:
            member = self._members.get(config.name)
            if member is None:
                self._join(config)
                continue
            member.config = config
            member.candidate.capabilities = config.capabilities
            member.availability.set_power(config.power)
        await asyncio.gather(*closing)

    def is_attempt(self, record: FinishedRequest) -> bool:
        """Whether a member scheduler's record is an attempt of a request of this pool.

        The pool reports that request once, at its end, to its own listeners; a listener of the
        member schedulers that reports every request once (an event) leaves attempts out. Read
        while the scheduler reports it (its listeners are called with the record).
        """
        return any(
            record is attempt
            for journey in self._live.values()
            for attempt in journey.attempts
        )

    def report_queue(self, server: str, waiting: int) -> None:
        """Take the requests waiting inside a server that its scheduler did not send.

        What the server's own metrics say (vLLM's ``num_requests_waiting``): an engine shared
        with other clients, or a distributed one, queues work of its own, which routing counts
        as ahead of a new request there.
        """
        self._member(server).candidate.server_waiting = max(waiting, 0)

    def stream(
        self, request: ChatRequest, **how: Unpack[PoolSubmission]
    ) -> AsyncGenerator[StreamChunk]:
        """Route a request and stream its answer, from whichever servers serve it.

        Nothing happens until iteration starts. Closing the iterator early (or cancelling the
        task) frees the slot or queue place at the server it is on at once.
        """
        return self._run(request, how, None)

    async def generate(
        self, request: ChatRequest, **how: Unpack[PoolSubmission]
    ) -> GenerateResult:
        """Run a request to the end and collect its answer."""
        sink: list[FinishedRequest] = []
        async with contextlib.aclosing(self._run(request, how, sink)) as chunks:
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

    def prepare(
        self,
        lane: Lane = Lane.VOICE,
        *,
        within_s: float = PREPARE_HOLD_S,
        wake: bool = True,
    ) -> None:
        """Make room for a coming command of an urgent lane where it will go; wake the better ones.

        The server it would go to now makes room (``Scheduler.prepare``) and stays awake meanwhile;
        with ``wake``, the sleeping servers the lane prefers to that one start waking, so the
        follow-up may go there.
        """
        if not lane.urgent or self._closed:
            return
        now = self._clock()
        chosen = self._preferred(lane, now)
        for name in self.route(lane):
            member = self._members[name]
            if member is chosen:
                member.scheduler.prepare(lane, within_s=within_s)
                member.availability.hold(now + within_s)
                return
            if wake:
                member.availability.wake_soon()

    def snapshot(self) -> PoolSnapshot:
        """Return the pool's state: each server's, the server each lane prefers now, the totals."""
        now = self._clock()
        return PoolSnapshot(
            taken_at=now,
            members={
                name: MemberSnapshot(
                    name=name,
                    state=member.availability.state,
                    scheduler=member.scheduler.snapshot(),
                    served_total=member.served_total,
                    failures_total=member.failures_total,
                    resumed_total=member.resumed_total,
                )
                for name, member in self._members.items()
            },
            preferred={
                lane: (chosen.name if (chosen := self._preferred(lane, now)) else None)
                for lane in LANES
            },
            requests_total=self._requests_total,
            failovers_total=self._failovers_total,
            in_flight=len(self._live),
        )

    def place(
        self, request: ChatRequest, lane: Lane, prompt_tokens: int | None = None
    ) -> Estimate | None:
        """Where a request would go now and what it would feel there (None: no server is up).

        Routing's decision, as ``stream`` takes it (the conversation's incumbent is updated).
        """
        shape = self._router.shape(request, prompt_tokens)
        output = request.max_tokens
        up = [
            member
            for name in self.route(lane)
            if (member := self._members[name]).availability.state is ServerState.UP
            and self._refusal(member, request, shape, lane) is None
        ]
        if not up:
            return None
        return self._router.choose(
            [member.candidate for member in up],
            shape,
            lane,
            output if output is not None else lane.defaults.default_output_tokens,
            self._clock(),
        )

    async def close(self) -> None:
        """Stop probing, waking and sleeping; refuse new requests. Running ones go on, without failover."""
        self._closed = True
        for remove in self._removers.values():
            remove()
        await asyncio.gather(
            *(member.availability.close() for member in self._members.values())
        )

    # --- one request ------------------------------------------------------------------------------

    async def _run(
        self,
        request: ChatRequest,
        how: PoolSubmission,
        sink: list[FinishedRequest] | None,
    ) -> AsyncGenerator[StreamChunk]:
        """Route the request, stream it, and move it to another server when one fails."""
        journey = Journey(
            next(self._seq),
            request,
            how,
            shape=self._router.shape(request, how.get("prompt_tokens")),
            now=self._clock(),
            sink=sink,
        )
        self._live[journey.seq] = journey
        member: Member | None = None
        outcome, error = "cancelled", None
        try:
            self._check_open()
            while True:
                member = await self._place(journey, member)
                attempt = journey.attempt(member)
                if attempt is None:
                    outcome = "ok"
                    yield StreamChunk(done=True, finish_reason="length")
                    return
                failure: Exception | None = None
                records: list[FinishedRequest] = []
                journey.attempts = records
                attempt_output = 0
                received = False
                journey.submitted_at = self._clock()
                async with contextlib.aclosing(
                    member.scheduler.stream(
                        attempt, records, **self._submission(journey)
                    )
                ) as chunks:
                    while True:
                        try:
                            chunk = await self._next(
                                chunks, journey, member, first=not received
                            )
                        except Exception as err:  # noqa: BLE001 - judged below, raised or passed on
                            failure = err
                            break
                        if chunk.done:
                            self._ended(member, records, journey, chunk)
                            outcome = "ok"
                            yield journey.final(chunk, attempt_output)
                            return
                        received = True
                        attempt_output += chunk.output_tokens
                        journey.took(chunk, self._clock())
                        yield chunk
                journey.records.extend((member.name, record) for record in records)
                self._failed(member, journey, failure)
        except Exception as err:
            outcome, error = "error", type(err).__name__
            if isinstance(err, REFUSALS):
                outcome = "rejected"
            raise
        finally:
            self._finish(journey, member, outcome, error)

    async def _next(
        self,
        chunks: AsyncIterator[StreamChunk],
        journey: Journey,
        member: Member,
        *,
        first: bool,
    ) -> StreamChunk:
        """Return the next chunk of an attempt; an urgent lane's stall raises TimeoutError.

        An urgent request stalls when its server sends nothing for ``urgent_stall_s`` beyond the
        first token the router expected, or between two chunks, while another server that may
        serve it is up; with none up it keeps waiting here, and looks again every
        ``urgent_stall_s``.
        """
        try:
            if not journey.lane.urgent:
                return await anext(chunks)
            limit = self._settings.urgent_stall_s
            if first:
                limit += journey.expected_ttft_s
            pending = asyncio.ensure_future(anext(chunks))
            try:
                while True:
                    done, _ = await asyncio.wait((pending,), timeout=limit)
                    if done:
                        return pending.result()
                    if self._alternative(journey, member):
                        raise TimeoutError
                    limit = self._settings.urgent_stall_s
            finally:
                if not pending.done():
                    pending.cancel()
                    await asyncio.wait((pending,))
        except StopAsyncIteration:
            raise StreamClosedError(
                "the scheduler ended the stream before it said it was done"
            ) from None

    def _alternative(self, journey: Journey, member: Member) -> bool:
        """Whether another server the request may move to is up."""
        if journey.server is not None:
            return False
        members = self._members
        return any(
            name != member.name
            and name not in journey.tried
            and members[name].availability.state is ServerState.UP
            for name in self.route(journey.lane)
        )

    def _submission(self, journey: Journey) -> Submission:
        """Return what the next attempt tells its server's scheduler besides the request."""
        prompt = (
            journey.prompt_tokens
            if journey.prompt_tokens is not None
            else journey.shape.tokens  # the scheduler's own estimate, worked out once
        )
        if journey.parts:
            prompt += journey.output_tokens  # the kept output is prompt now
        deadline = journey.deadline_s
        if deadline is not None:
            deadline = max(0.0, deadline - (self._clock() - journey.arrived_at))
        return {
            "lane": journey.lane,
            "requester": journey.requester,
            "prompt_tokens": prompt,
            "deadline_s": deadline,
        }

    def _failed(
        self, member: Member, journey: Journey, failure: Exception | None
    ) -> None:
        """Judge an attempt that failed on ``member``: mark it, raise unless another may go on."""
        if failure is None:
            failure = StreamClosedError("the server's stream ended without an answer")
        marks_down = isinstance(failure, MOVE_AND_MARK_DOWN) or (
            isinstance(failure, BackendHTTPError)
            and failure.status >= 500
            and not isinstance(failure, ServerBusyError)
        )
        if marks_down:
            member.availability.failed()
        movable = marks_down or isinstance(failure, MOVE_ON)
        if (
            not movable
            or self._closed
            or journey.server is not None
            or journey.tool_calls_sent
        ):
            raise failure
        member.failures_total += 1
        journey.tried.add(member.name)
        _LOGGER.info(
            "request %s failed on %s (%s); moving it to the next server",
            journey.seq,
            member.name,
            type(failure).__name__,
        )
        journey.failed = failure

    # --- placement -------------------------------------------------------------------------------

    async def _place(self, journey: Journey, previous: Member | None) -> Member:
        """Return the server of the next attempt: routed among those up, else woken; or raise."""
        lane = journey.lane
        names = (journey.server,) if journey.server is not None else self.route(lane)
        while True:
            able: list[Member] = []
            reasons: list[str] = []
            breaches: list[LimitExceededError] = []
            for name in names:
                if name in journey.tried:
                    continue
                member = self._members.get(name)
                if member is None:
                    raise NoServerError(
                        lane=lane.key, reason=f"the pool has no server named {name}"
                    )
                refusal = self._refusal(member, journey.request, journey.shape, lane)
                if isinstance(refusal, LimitExceededError):
                    breaches.append(refusal)
                    reasons.append(f"{name}: {refusal.message}")
                elif refusal is not None:
                    reasons.append(f"{name}: {refusal}")
                else:
                    able.append(member)
            if not able:
                if breaches and len(breaches) == len(reasons) and not journey.tried:
                    raise breaches[0]  # the request breaks its lane's limits everywhere
                raise self._nothing_left(journey, reasons, previous)
            up = [m for m in able if m.availability.state is ServerState.UP]
            if up:
                chosen = self._router.choose(
                    [member.candidate for member in up],
                    journey.shape,
                    lane,
                    journey.max_tokens
                    if journey.max_tokens is not None
                    else lane.defaults.default_output_tokens,
                    self._clock(),
                )
                member = self._members[chosen.server]
                journey.expected_ttft_s = chosen.ttft_s
                break
            if lane.urgent:
                raise NoServerError(
                    lane=lane.key,
                    reason="every server that may serve it is down or asleep",
                )
            sleeping = [m for m in able if m.availability.can_wake]
            if not sleeping:
                raise NoServerError(
                    lane=lane.key, reason="every server that may serve it is down"
                )
            waking = [m for m in sleeping if m.availability.state is ServerState.WAKING]
            member = (waking or sleeping)[0]
            if await member.availability.awake():
                journey.expected_ttft_s = 0.0
                break
            journey.tried.add(member.name)
            journey.failed = WakeTimeoutError(
                lane=lane.key,
                server=member.name,
                limit_s=member.config.power.wake_limit_s,
            )
        member.candidate.recent.note(journey.shape.keys)
        journey.path.append(member.name)
        if previous is not None and previous is not member:
            journey.failovers += 1
            self._failovers_total += 1
            if journey.parts:
                journey.resumed_on = member.name
                member.resumed_total += 1
        return member

    def _nothing_left(
        self, journey: Journey, reasons: list[str], previous: Member | None
    ) -> LanesError:
        """Return the error of a request no server is left for."""
        if isinstance(journey.failed, LanesError):
            return journey.failed
        lane = journey.lane.key
        if previous is not None or journey.tried:
            return NoServerError(
                lane=lane, reason="every server that may serve it failed"
            )
        return NoServerError(
            lane=lane,
            reason="; ".join(reasons) or "the pool has no server for this lane",
        )

    def _refusal(
        self, member: Member, request: ChatRequest, shape: PromptShape, lane: Lane
    ) -> LimitExceededError | str | None:
        """Why ``member`` cannot serve the request (None: it can)."""
        limits = member.scheduler.settings.lanes.get(lane)
        if limits is None:
            return f"it has no {lane.key} lane"
        output = (
            request.max_tokens
            if request.max_tokens is not None
            else limits.default_output_tokens
        )
        breach = limits.refusal(lane, prompt_tokens=shape.tokens, output_tokens=output)
        if breach is not None:
            return breach
        return member.candidate.capabilities.refusal(request, shape.tokens, output)

    def _preferred(self, lane: Lane, now: float) -> Member | None:
        """Return the server the lane's next request would go to now (short, nothing warm)."""
        probe = ChatRequest(
            model=ANY_MODEL, messages=(ChatMessage(role="user", content="?"),)
        )
        shape = self._router.shape(probe, 1)
        up = [
            member
            for name in self.route(lane)
            if (member := self._members[name]).availability.state is ServerState.UP
        ]
        if not up:
            return None
        estimates = [
            self._router.estimate(member.candidate, shape, lane, 1, now)
            for member in up
        ]
        best = min(estimates, key=lambda e: e.felt_s)
        return self._members[best.server]

    # --- the end of a request ----------------------------------------------------------------------

    def _ended(
        self,
        member: Member,
        records: list[FinishedRequest],
        journey: Journey,
        chunk: StreamChunk,
    ) -> None:
        """Learn from an attempt that answered to its end on ``member``."""
        journey.records.extend((member.name, record) for record in records)
        member.served_total += 1
        if records:
            member.candidate.observed.learn(records[-1], chunk.usage)

    def _finish(
        self,
        journey: Journey,
        member: Member | None,
        outcome: str,
        error: str | None,
    ) -> None:
        """Report the request, exactly once."""
        if self._live.pop(journey.seq, None) is None:
            return
        self._requests_total += 1
        now = self._clock()
        last = journey.records[-1][1] if journey.records else None
        lane = last.lane if last is not None else journey.lane
        limits = (
            member.scheduler.settings.lanes[lane]
            if member is not None and lane in member.scheduler.settings.lanes
            else lane.defaults
        )
        ttft = (
            None
            if journey.first_token_at is None
            else journey.first_token_at - journey.arrived_at
        )
        itl_p95 = request_itl_p95(journey.gaps)
        queue_wait = (
            journey.submitted_at - journey.arrived_at + last.queue_wait_s
            if last is not None
            else now - journey.arrived_at
        )
        record = FinishedRequest(
            request_id=f"pool-{journey.seq}",
            lane=lane,
            requester=journey.requester,
            outcome=outcome,
            error=error,
            queue_wait_s=queue_wait,
            ttft_s=ttft,
            itl_p95_s=itl_p95,
            itl_max_s=max(journey.gaps) if journey.gaps else None,
            e2e_s=now - journey.arrived_at,
            prompt_tokens=journey.records[0][1].prompt_tokens
            if journey.records
            else journey.shape.tokens,
            output_tokens=journey.output_tokens
            if journey.resumed_on is not None or last is None
            else last.output_tokens,
            token_source=last.token_source if last is not None else "estimate",
            preemptions=sum(r.preemptions for _, r in journey.records),
            met_ttft=ttft is not None and ttft <= limits.ttft_slo_s,
            met_itl=outcome != "rejected"
            and (itl_p95 is None or itl_p95 <= limits.itl_slo_s),
            server=member.name if member is not None else None,
            failovers=journey.failovers,
            resumed_on=journey.resumed_on,
            path=tuple(journey.path),
        )
        if journey.sink is not None:
            journey.sink.append(record)
        for listener in tuple(self._listeners):
            try:
                listener(record)
            except Exception:
                _LOGGER.exception("listener for finished requests failed")

    def _check_open(self) -> None:
        if self._closed:
            raise SchedulerClosedError

    def _member(self, server: str) -> Member:
        """Return the member named ``server`` (KeyError: none is)."""
        member = self._members.get(server)
        if member is None:
            raise KeyError(f"the pool has no server named {server!r}")
        return member
