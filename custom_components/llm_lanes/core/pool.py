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
``failovers``, the server it ``resumed_on`` and the ``path`` of its attempts. The member
schedulers report each attempt as usual (an attempt abandoned on a failing server is an error
there).

Here: the pool's door and the run loop of a request. A member's state is ``pool_members.py``'s,
where a request goes ``pool_placement.py``'s, a request's journey and failover
``pool_journey.py``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
import contextlib
from functools import partial
import itertools
import logging
import time
from typing import Unpack

from custom_components.llm_lanes.core.availability import ServerState
from custom_components.llm_lanes.core.errors import REFUSALS, SchedulerClosedError
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.model import (
    Answer,
    ChatRequest,
    StreamChunk,
    TokenUsage,
)
from custom_components.llm_lanes.core.pool_journey import (
    Journey,
    PoolSubmission,
    next_chunk,
)
from custom_components.llm_lanes.core.pool_members import (
    Listener,
    Member,
    PoolMember,
    PoolSettings,
    check_members,
    noting_activity,
)
from custom_components.llm_lanes.core.pool_placement import Placement
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.router import Estimate
from custom_components.llm_lanes.core.scheduler import PREPARE_HOLD_S
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
        self.quotas = quotas
        """The household's ledger of tokens per requester (shared by the member schedulers)."""
        check_members(members, settings)
        self._members: dict[str, Member] = {}
        self._placement = Placement(self._members, settings, self._clock)
        self._removers: dict[str, Callable[[], None]] = {}
        for config in members:
            self._join(config)
        self._seq = itertools.count(1)
        self._listeners: list[Listener] = []
        self._live: dict[int, Journey] = {}
        self._requests_total = 0
        self._failovers_total = 0
        self._closed = False

    def _join(self, config: PoolMember) -> None:
        member = Member(config, self.settings, self._clock, self._clock_rate)
        self._members[config.name] = member
        self._removers[config.name] = config.scheduler.add_listener(
            noting_activity(member.availability)
        )

    # --- public API ------------------------------------------------------------------------------

    @property
    def settings(self) -> PoolSettings:
        """How the pool routes."""
        return self._placement.settings

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
        return self._placement.route(lane)

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
        settings = settings if settings is not None else self.settings
        check_members(members, settings)
        self._placement.configure(settings)
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
        chosen = self._placement.preferred(lane, now)
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
                lane: (
                    chosen.name
                    if (chosen := self._placement.preferred(lane, now))
                    else None
                )
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
        return self._placement.estimate(request, lane, prompt_tokens)

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
            shape=self._placement.router.shape(request, how.get("prompt_tokens")),
            now=self._clock(),
            sink=sink,
        )
        self._live[journey.seq] = journey
        member: Member | None = None
        outcome, error = "cancelled", None
        try:
            self._check_open()
            while True:
                chosen = await self._placement.next_server(journey, member)
                if journey.went_to(chosen, member):
                    self._failovers_total += 1
                member = chosen
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
                        attempt, records, **journey.submission(self._clock())
                    )
                ) as chunks:
                    while True:
                        try:
                            chunk = await next_chunk(
                                chunks,
                                journey,
                                first=not received,
                                stall_s=self.settings.urgent_stall_s,
                                alternative=partial(
                                    self._placement.alternative, journey, member
                                ),
                            )
                        except Exception as err:  # noqa: BLE001 - judged below, raised or passed on
                            failure = err
                            break
                        if chunk.done:
                            journey.ended(member, records, chunk)
                            outcome = "ok"
                            yield journey.final(chunk, attempt_output)
                            return
                        received = True
                        attempt_output += chunk.output_tokens
                        journey.took(chunk, self._clock())
                        yield chunk
                journey.records.extend((member.name, record) for record in records)
                journey.failed_on(member, failure, closed=self._closed)
        except Exception as err:
            outcome, error = "error", type(err).__name__
            if isinstance(err, REFUSALS):
                outcome = "rejected"
            raise
        finally:
            self._finish(journey, member, outcome, error)

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
        record = journey.record(member, outcome, error, self._clock())
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
