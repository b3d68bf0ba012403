"""Where a benchmark run sends its requests, per policy and number of servers.

One server: ``direct`` streams straight from its client (an integration without a scheduler),
``fifo`` and ``lanes`` go through its ``Scheduler`` with that policy.

Several servers (or one the scenario stops and starts):

- ``direct`` is what a household puts in front of two boxes today, a reverse proxy with a backup
  server (nginx ``upstream { server gpu; server mini backup; }`` with its default passive checks,
  ``max_fails=1 fail_timeout=10s`` and ``proxy_next_upstream error timeout``): each request goes to
  the first server in the order given that did not fail in the last ``FAIL_TIMEOUT_S`` seconds
  (every server, in order, when all did); a refused connection or a timeout before anything was
  passed on moves it to the next; a stream that breaks after it began fails. It wakes nothing.
  Round-robin (nginx's default without ``backup``) would send half of the voice commands to the
  slower box, which no household with a fast and a slow box would choose.
- ``fifo`` and ``lanes`` go through a ``ServerPool`` of one scheduler per server, with that policy:
  routing, failover that resumes a broken answer on another server, waking a server asleep.

Every target is a ``Target``: ``stream`` one request, ``prepare`` for an announced command, its
``queue_depth`` now, ``close``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
import contextlib
from dataclasses import replace
import itertools
from typing import Protocol

from custom_components.llm_lanes.core.availability import (
    PowerControl,
    ServerState,
    answers,
)
from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.servers import (
    BenchServer,
    Power,
    ServerTally,
)
from custom_components.llm_lanes.core.errors import (
    BackendConnectionError,
    BackendTimeoutError,
    StreamClosedError,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk
from custom_components.llm_lanes.core.pool import ServerPool
from custom_components.llm_lanes.core.pool_members import PoolMember, PoolSettings
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.router import Capabilities
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.snapshot import FinishedRequest

type Finished = Callable[[FinishedRequest], None]
type Clock = Callable[[], float]

FAIL_TIMEOUT_S = 10.0
"""How long ``direct`` over several servers skips a server that failed (nginx's ``fail_timeout``)."""
_NEXT_UPSTREAM: tuple[type[Exception], ...] = (
    BackendConnectionError,
    BackendTimeoutError,
    StreamClosedError,
)
"""What moves a ``direct`` request to the next server (nginx's ``proxy_next_upstream error timeout``)."""
STATE_SAMPLE_S = 0.1
"""How often (scenario seconds) the pool's view of each server is sampled for the report."""


class Target(Protocol):
    """Where a run's requests go (see the module docstring)."""

    def stream(
        self, request: ChatRequest, *, lane: Lane, requester: str, prompt_tokens: int
    ) -> AsyncIterator[StreamChunk]:
        """Stream one request's answer."""
        ...

    def prepare(self, lane: Lane) -> None:
        """Hear of a coming command of ``lane``."""
        ...

    def queue_depth(self) -> int:
        """Return the requests waiting in the benchmark's schedulers now."""
        ...

    async def close(self) -> None:
        """Stop; nothing more is sent."""
        ...


class _Unscheduled:
    """A target without a scheduler of its own: it hears of no coming command, keeps no queue."""

    def prepare(self, lane: Lane) -> None:
        """Nothing is told of a coming command (a reverse proxy is not either)."""

    def queue_depth(self) -> int:
        """Nothing waits on this side."""
        return 0

    async def close(self) -> None:
        """Nothing to stop."""


class Direct(_Unscheduled):
    """One server, straight from its client."""

    def __init__(self, backend: Backend) -> None:
        """Send to ``backend``."""
        self._backend = backend

    def stream(
        self, request: ChatRequest, *, lane: Lane, requester: str, prompt_tokens: int
    ) -> AsyncIterator[StreamChunk]:
        """Stream from the server."""
        return self._backend.chat(request)


class _Queued:
    """A target whose requests queue in front of the servers, in ``_front``.

    ``_front`` is a ``Scheduler`` (one server) or a ``ServerPool`` (several): it streams each
    request and makes room for a coming command (a pool where the command will go, waking the
    servers the lane prefers to it).
    """

    _front: Scheduler | ServerPool

    def stream(
        self, request: ChatRequest, *, lane: Lane, requester: str, prompt_tokens: int
    ) -> AsyncIterator[StreamChunk]:
        """Stream through the scheduler or the pool."""
        return self._front.stream(
            request, lane=lane, requester=requester, prompt_tokens=prompt_tokens
        )

    def prepare(self, lane: Lane) -> None:
        """Make room for the command."""
        self._front.prepare(lane)


class Scheduled(_Queued):
    """One server behind its scheduler."""

    def __init__(
        self,
        backend: Backend,
        settings: SchedulerSettings,
        *,
        clock: Clock,
        clock_rate: float,
        on_finished: Finished,
    ) -> None:
        """Build the scheduler; ``on_finished`` gets its records."""
        self._scheduler = Scheduler(
            backend, settings, clock=clock, clock_rate=clock_rate
        )
        self._remove = self._scheduler.add_listener(on_finished)
        self._front = self._scheduler

    def queue_depth(self) -> int:
        """Return the scheduler's queue depth."""
        return self._scheduler.snapshot().queue_depth

    async def close(self) -> None:
        """Close the scheduler."""
        await self._scheduler.close()
        self._remove()


class Upstreams(_Unscheduled):
    """``direct`` over several servers: a reverse proxy with backup servers (module docstring)."""

    def __init__(
        self,
        servers: Sequence[BenchServer],
        tallies: Mapping[str, ServerTally],
        *,
        clock: Clock,
    ) -> None:
        """Send to ``servers`` in their order; count what each did in ``tallies``."""
        self._servers = tuple(servers)
        self._tallies = tallies
        self._clock = clock
        self._failed_at: dict[str, float] = {}

    def stream(
        self, request: ChatRequest, *, lane: Lane, requester: str, prompt_tokens: int
    ) -> AsyncIterator[StreamChunk]:
        """Stream from the first server that answers."""
        return self._stream(request, lane, prompt_tokens)

    async def _stream(
        self, request: ChatRequest, lane: Lane, prompt_tokens: int
    ) -> AsyncGenerator[StreamChunk]:
        now = self._clock()
        order = [
            server
            for server in self._servers
            if now - self._failed_at.get(server.name, float("-inf")) >= FAIL_TIMEOUT_S
        ] or list(self._servers)
        previous: str | None = None
        failure: Exception | None = None
        for server in order:
            tally = self._tallies[server.name]
            if previous is not None:
                self._tallies[previous].failovers_from += 1
                tally.failovers_to += 1
            attempt = replace(request, model=server.description.model)
            passed = False
            streamed = 0
            stream = server.backend.chat(attempt)
            try:
                async for chunk in stream:
                    if chunk.text or chunk.output_tokens or chunk.tool_calls:
                        streamed += max(1, chunk.output_tokens)
                    if chunk.done:
                        usage = chunk.usage
                        tally.prompt_tokens += (
                            usage.prompt_tokens if usage is not None else prompt_tokens
                        )
                        tally.output_tokens += (
                            usage.output_tokens if usage is not None else streamed
                        )
                        tally.serve(lane.key)
                    passed = True
                    yield chunk
            except Exception as err:
                tally.failed_attempts += 1
                if streamed:
                    tally.prompt_tokens += prompt_tokens
                    tally.output_tokens += streamed
                if not isinstance(err, _NEXT_UPSTREAM):
                    raise
                self._failed_at[server.name] = self._clock()
                if passed:
                    raise
                previous, failure = server.name, err
            else:
                return
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
        assert failure is not None
        raise failure


class Pooled(_Queued):
    """Several servers as one ``ServerPool``, one scheduler per server (module docstring)."""

    def __init__(
        self,
        servers: Sequence[BenchServer],
        settings: Sequence[SchedulerSettings],
        tallies: Mapping[str, ServerTally],
        *,
        routes: Mapping[Lane, tuple[str, ...]],
        asleep: Mapping[str, Power],
        clock: Clock,
        clock_rate: float,
        on_finished: Finished,
    ) -> None:
        """Pool ``servers`` (each with its ``settings``); those in ``asleep`` start asleep.

        A server asleep at the start wakes by its ``Power.wake``; the others have no wake action
        (a server that crashed is not woken: it is probed until it answers again).
        """
        quotas = QuotaLedger()
        self._clock = clock
        self._rate = clock_rate
        self._tallies = tallies
        self._on_finished = on_finished
        self._schedulers = {
            server.name: Scheduler(
                server.backend,
                server_settings,
                clock=clock,
                clock_rate=clock_rate,
                quotas=quotas,
            )
            for server, server_settings in zip(servers, settings, strict=True)
        }
        self._removers = [
            scheduler.add_listener(self._attempted(tallies[name]))
            for name, scheduler in self._schedulers.items()
        ]
        self.pool = ServerPool(
            [
                PoolMember(
                    name=server.name,
                    scheduler=self._schedulers[server.name],
                    health=answers(server.backend),
                    capabilities=Capabilities(
                        model=server.description.model,
                        context_tokens=server.description.context,
                    ),
                    power=PowerControl(
                        wake=asleep[server.name].wake if server.name in asleep else None
                    ),
                    state=ServerState.ASLEEP
                    if server.name in asleep
                    else ServerState.UP,
                )
                for server in servers
            ],
            PoolSettings(routes=routes),
            quotas=quotas,
            clock=clock,
            clock_rate=clock_rate,
        )
        self._removers.append(self.pool.add_listener(self._finished))
        self._front = self.pool
        for tally in tallies.values():
            tally.state_s = {}
        self._sampler = asyncio.get_running_loop().create_task(self._sample_states())

    def queue_depth(self) -> int:
        """Return the member schedulers' queue depths, summed."""
        return sum(
            scheduler.snapshot().queue_depth for scheduler in self._schedulers.values()
        )

    async def close(self) -> None:
        """Close the pool and its schedulers."""
        self._sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sampler
        await self.pool.close()
        for scheduler in self._schedulers.values():
            await scheduler.close()
        for remove in self._removers:
            remove()

    def _finished(self, record: FinishedRequest) -> None:
        if record.outcome == "ok" and record.server is not None:
            self._tallies[record.server].serve(record.lane.key)
        for left, reached in itertools.pairwise(record.path):
            self._tallies[left].failovers_from += 1
            self._tallies[reached].failovers_to += 1
        if record.resumed_on is not None:
            self._tallies[record.resumed_on].resumed_here += 1
        self._on_finished(record)

    @staticmethod
    def _attempted(tally: ServerTally) -> Finished:
        def note(record: FinishedRequest) -> None:
            if record.outcome == "ok" or record.output_tokens:
                tally.prompt_tokens += record.prompt_tokens
                tally.output_tokens += record.output_tokens
            if record.outcome == "error":
                tally.failed_attempts += 1

        return note

    async def _sample_states(self) -> None:
        last = self._clock()
        while True:
            await asyncio.sleep(STATE_SAMPLE_S / self._rate)
            now = self._clock()
            for name, tally in self._tallies.items():
                assert tally.state_s is not None
                state = str(self.pool.state(name))
                tally.state_s[state] = tally.state_s.get(state, 0.0) + (now - last)
            last = now
