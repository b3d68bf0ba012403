"""Replay a scenario against one server or several, with or without the scheduler, and record every request.

Policies: ``direct`` sends each request straight to the backend client (what an integration
without a scheduler does); ``fifo`` and ``lanes`` go through the real ``Scheduler`` with that
policy. Over several servers (``run_servers``), ``direct`` is a reverse proxy with backup servers
and ``fifo`` and ``lanes`` a ``ServerPool`` of one scheduler per server (``targets.py``); the
scenario's events kill and start servers on time, and the result says what each server did
(``servers.py``).

Time: all figures are in scenario seconds. Against a simulated server running ``speed`` times
faster, pass ``time_scale=speed``: arrivals are compressed by that factor and every measured
duration is stretched back, so the figures read as if the server ran at speed 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
import contextlib
from dataclasses import dataclass, field, replace
import random
import sys
import time
from typing import Any, Literal, TextIO, TypedDict, Unpack

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.servers import (
    BenchServer,
    Power,
    ServerDescription,
    ServerTally,
)
from custom_components.llm_lanes.core.bench.targets import (
    Direct,
    Pooled,
    Scheduled,
    Target,
    Upstreams,
)
from custom_components.llm_lanes.core.bench.workload import (
    PlannedRequest,
    RequestClass,
    Scenario,
    ServerEvent,
    class_rng,
    plan_open_requests,
    prompt_text,
)
from custom_components.llm_lanes.core.errors import (
    BackendError,
    NoServerError,
    SchedulerError,
    ServerBusyError,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest, StreamChunk
from custom_components.llm_lanes.core.router import ANY_MODEL
from custom_components.llm_lanes.core.settings import Policy, SchedulerSettings
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from custom_components.llm_lanes.core.tokens import (
    TOKENS_PER_MESSAGE,
    estimate_text_tokens,
)

BenchPolicy = Literal["direct", "fifo", "lanes"]
POLICIES: tuple[BenchPolicy, ...] = ("direct", "fifo", "lanes")
SYSTEM_PROMPT = "You are a helpful home assistant. Answer briefly."
# What the system message costs (text plus its template tokens): the simulator counts as the
# scheduler estimates, four characters a token.
_SYSTEM_TOKENS = estimate_text_tokens(SYSTEM_PROMPT) + TOKENS_PER_MESSAGE


@dataclass(slots=True)
class RequestRecord:
    """What one request of the run did, in scenario seconds from the start of the run."""

    class_name: str
    requester: str
    sent_at: float
    planned_prompt_tokens: int
    planned_output_tokens: int
    outcome: str = "pending"
    """"ok", "rejected", "error", "cancelled"."""
    error: str | None = None
    ttft_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    """Arrival time of each chunk that carried output."""
    token_counts: list[int] = field(default_factory=list)
    e2e_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int | None = None
    """Prompt tokens the server took from its cache (where it says)."""
    evaluated_prompt_tokens: int | None = None
    """Prompt tokens the server evaluated, resumptions after preemptions included (where it says)."""

    @property
    def gaps(self) -> list[float]:
        """Inter-token gaps (between chunks that carried output)."""
        times = self.token_times
        return [
            later - earlier for earlier, later in zip(times, times[1:], strict=False)
        ]


@dataclass(frozen=True, slots=True)
class ServerRun:
    """One server of a run over several, and what it did."""

    server: BenchServer
    tally: ServerTally


@dataclass(slots=True)
class RunResult:
    """Everything a report needs."""

    scenario: Scenario
    policy: BenchPolicy
    settings: SchedulerSettings
    server: ServerDescription
    records: list[RequestRecord]
    finished: list[tuple[str, FinishedRequest]]
    """Scheduler records of the run, with the class each belongs to (empty for direct)."""
    queue_depth_max: int
    kv_use_max: float | None
    wall_s: float
    servers: tuple[ServerRun, ...] = ()
    """What each server did, in a run over several servers or one the scenario stops and starts
    (empty: one server, up throughout)."""


Progress = Callable[[float, int], None]
"""Called with (scenario seconds elapsed, requests finished) twice a second."""


async def describe_server(backend: Backend, model: str | None) -> ServerDescription:
    """Ask the server what it is (for the report) and pick the model."""
    info = await backend.server_info()
    chosen = model or (info.loaded_models[0] if info.loaded_models else None)
    chosen = chosen or (info.models[0] if info.models else "default")
    return ServerDescription(
        kind=str(info.kind),
        version=info.version,
        model=chosen,
        slots=info.slots,
        context=info.context_length,
    )


def settings_for_server(server: ServerDescription) -> SchedulerSettings:
    """Return the default settings as Home Assistant sets them for this server (its slots)."""
    base = SchedulerSettings()
    if not server.slots:
        return base
    return replace(
        base,
        max_sequences=server.slots,
        server_slots=server.slots,
        headroom=min(base.headroom, server.slots - 1),
    )


def settings_for(policy: BenchPolicy, settings: SchedulerSettings) -> SchedulerSettings:
    """Return the scheduler settings a policy runs with."""
    if policy == "fifo":
        return replace(settings, policy=Policy.FIFO)
    if policy == "lanes":
        return replace(settings, policy=Policy.LANES)
    return settings


class RunOptions(TypedDict, total=False):
    """How a scenario is replayed, whatever it is replayed against."""

    time_scale: float
    """Scenario seconds per second (a simulator's speed); 1 by default."""
    prompt_scale: float
    """Prompt text per planned token, against the server's tokenizer; 1 by default."""
    prompt_salt: str
    """Changes every prompt's text (not its length): runs against one server should each pass
    their own, or a server's prompt cache would answer a later run's prefill with an earlier
    run's identical prompts and flatter it."""
    drain_s: float | None
    """How long requests still running at the end may finish (a fifth of the scenario, 5 s at
    least, by default)."""
    progress: Progress | None


async def run_scenario(
    backend: Backend,
    scenario: Scenario,
    *,
    policy: BenchPolicy,
    settings: SchedulerSettings,
    server: ServerDescription,
    **options: Unpack[RunOptions],
) -> RunResult:
    """Replay ``scenario`` against one server and record every request (module docstring)."""
    return await run_servers(
        [BenchServer(name="1", backend=backend, description=server)],
        scenario,
        policy=policy,
        settings=[settings],
        **options,
    )


async def run_servers(
    servers: Sequence[BenchServer],
    scenario: Scenario,
    *,
    policy: BenchPolicy,
    settings: Sequence[SchedulerSettings],
    lane_servers: Mapping[Lane, tuple[int, ...]] | None = None,
    **options: Unpack[RunOptions],
) -> RunResult:
    """Replay ``scenario`` over ``servers`` (each with its ``settings``) and record every request.

    ``lane_servers`` overrides the scenario's per lane (servers by number, most preferred first).
    A run that stops a server starts it again at its end. ValueError (before anything is sent):
    the scenario names a server beyond those given, or stops one the benchmark cannot stop.
    """
    if not servers or len(settings) != len(servers):
        raise ValueError("give one settings object per server")
    routes = {**scenario.lane_servers, **(lane_servers or {})}
    named = max(
        scenario.servers_named,
        max((n for numbers in routes.values() for n in numbers), default=0),
    )
    if named > len(servers):
        raise ValueError(
            f"the scenario names server {named}, but only {len(servers)} "
            f"server{'s are' if len(servers) > 1 else ' is'} given"
        )
    run = _Run(
        servers=servers,
        scenario=scenario,
        policy=policy,
        settings=[settings_for(policy, one) for one in settings],
        routes={
            lane: tuple(str(n) for n in numbers) for lane, numbers in routes.items()
        },
        time_scale=options.get("time_scale", 1.0),
        prompt_scale=options.get("prompt_scale", 1.0),
        prompt_salt=options.get("prompt_salt", ""),
    )
    drain_s = options.get("drain_s")
    return await run.execute(
        drain_s if drain_s is not None else max(5.0, scenario.duration_s / 5),
        options.get("progress"),
    )


class _Run:
    def __init__(
        self,
        *,
        servers: Sequence[BenchServer],
        scenario: Scenario,
        policy: BenchPolicy,
        settings: Sequence[SchedulerSettings],
        routes: Mapping[Lane, tuple[str, ...]],
        time_scale: float,
        prompt_scale: float,
        prompt_salt: str,
    ) -> None:
        self.servers = tuple(servers)
        self.backend = servers[0].backend
        self.scenario = scenario
        self.policy = policy
        self.all_settings = tuple(settings)
        self.settings = settings[0]
        self.server = servers[0].description
        self.routes = routes
        self.several = len(servers) > 1 or bool(scenario.switches_servers)
        """Whether the run goes over several servers (or stops and starts its one)."""
        self.tallies = {server.name: ServerTally() for server in servers}
        self.scale = time_scale
        self.prompt_scale = prompt_scale
        self.prompt_salt = prompt_salt
        self.records: list[RequestRecord] = []
        self.finished: list[tuple[str, FinishedRequest]] = []
        self.queue_depth_max = 0
        self.kv_use_max: float | None = None
        self._loop = asyncio.get_running_loop()
        """Its clock is the run's (a virtual-time loop runs a scenario in no time)."""
        self._start = self._loop.time()
        self.powers = {
            server.name: Power(
                server,
                self.tallies[server.name],
                now=self.now,
                time_scale=time_scale,
                wake_delay_s=scenario.wake_delay_s,
            )
            for server in servers
            if int(server.name) in scenario.switches_servers
        }
        """The switches of the servers the scenario stops (ValueError for one that has none)."""
        self._target: Target | None = None
        self._owner: dict[tuple[Lane, str], str] = {
            (cls.lane, requester): cls.name
            for cls in scenario.classes
            for requester in cls.requesters
        }
        self._lane_of = {cls.name: cls.lane for cls in scenario.classes}
        self._classes = {cls.name: cls for cls in scenario.classes}
        self._prefixes: dict[str, str] = {}
        """Shared prefix text per group, long enough for every class of the group."""
        for cls in scenario.classes:
            if cls.shared_prefix_tokens:
                longest = max(
                    other.shared_prefix_tokens
                    for other in scenario.classes
                    if other.prefix_group == cls.prefix_group
                )
                # Salted per run, not per request: within a run the prefix is one stable prompt.
                rng = random.Random(
                    f"{prompt_salt}{scenario.seed}:prefix:{cls.prefix_group}"
                )
                self._prefixes[cls.prefix_group] = prompt_text(
                    longest, rng, scale=prompt_scale
                )

    def now(self) -> float:
        """Scenario seconds since the start."""
        return (self._loop.time() - self._start) * self.scale

    async def sleep_until(self, at: float) -> None:
        delay = (at - self.now()) / self.scale
        if delay > 0:
            await asyncio.sleep(delay)

    def _make_target(self) -> Target:
        """Return where the requests go (``targets.py``)."""
        scale = self.scale

        def clock() -> float:
            return self._loop.time() * scale

        if not self.several:
            if self.policy == "direct":
                return Direct(self.backend)
            return Scheduled(
                self.backend,
                self.settings,
                clock=clock,
                clock_rate=scale,
                on_finished=self._on_finished,
            )
        if self.policy == "direct":
            return Upstreams(self.servers, self.tallies, clock=clock)
        return Pooled(
            self.servers,
            self.all_settings,
            self.tallies,
            routes=self.routes,
            asleep={str(n): self.powers[str(n)] for n in self.scenario.asleep_at_start},
            clock=clock,
            clock_rate=scale,
            on_finished=self._on_finished,
        )

    async def execute(self, drain_s: float, progress: Progress | None) -> RunResult:
        for number in self.scenario.asleep_at_start:
            await self.powers[str(number)].kill()
        self._target = self._make_target()
        self._start = self._loop.time()
        for number in self.scenario.asleep_at_start:
            self.powers[str(number)].count_off_from(0.0)
        wall_start = self._loop.time()
        tasks: set[asyncio.Task[RequestRecord]] = set()
        closed: list[asyncio.Task[None]] = []
        for cls in self.scenario.classes:
            if cls.arrival.process == "closed":
                closed.extend(
                    asyncio.create_task(self._closed_loop(cls, worker))
                    for worker in range(cls.arrival.concurrency)
                )
        sampler = asyncio.create_task(self._sample(progress))
        starts: set[asyncio.Task[None]] = set()
        events = asyncio.create_task(self._play(self.scenario.events, starts))
        try:
            for at, planned, announce in self._timeline():
                await self.sleep_until(at)
                if announce:
                    self._target.prepare(self._lane_of[planned.class_name])
                    continue
                task = asyncio.create_task(self._send(planned))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await self.sleep_until(self.scenario.duration_s)
            for loop_task in closed:
                loop_task.cancel()
            await asyncio.gather(*closed, return_exceptions=True)
            if tasks:
                await asyncio.wait(list(tasks), timeout=drain_s / self.scale)
        finally:
            for pending in [*tasks, *closed, events, *starts]:
                pending.cancel()
            await asyncio.gather(
                *tasks, *closed, events, *starts, return_exceptions=True
            )
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await self._target.close()
            for power in self.powers.values():
                power.finish()
            wall_s = self._loop.time() - wall_start
            # The next run (or the user) finds every server as the run found it: running.
            for power in self.powers.values():
                await power.restore()
        return RunResult(
            scenario=self.scenario,
            policy=self.policy,
            settings=self.settings,
            server=self.server,
            records=self.records,
            finished=self.finished,
            queue_depth_max=self.queue_depth_max,
            kv_use_max=self.kv_use_max,
            wall_s=wall_s,
            servers=tuple(
                ServerRun(server, self.tallies[server.name]) for server in self.servers
            )
            if self.several
            else (),
        )

    async def _play(
        self, events: Sequence[ServerEvent], starts: set[asyncio.Task[None]]
    ) -> None:
        """Kill and start servers at the scenario's times (a start runs beside the next events)."""
        for event in events:
            await self.sleep_until(event.at_s)
            power = self.powers[str(event.server)]
            if event.action == "kill":
                await power.kill()
            else:
                task = asyncio.create_task(power.start())
                starts.add(task)
                task.add_done_callback(starts.discard)

    def _timeline(self) -> list[tuple[float, PlannedRequest, bool]]:
        """Return the open-loop requests in time order, each after its announcement (if any)."""
        events: list[tuple[float, PlannedRequest, bool]] = []
        for planned in plan_open_requests(self.scenario):
            lead = self._classes[planned.class_name].prepare_s
            if lead > 0:
                events.append((max(0.0, planned.at_s - lead), planned, True))
            events.append((planned.at_s, planned, False))
        events.sort(key=lambda event: (event[0], not event[2]))
        return events

    def _shared_prefix_tokens(self, class_name: str) -> int:
        return self._classes[class_name].shared_prefix_tokens

    def _on_finished(self, finished: FinishedRequest) -> None:
        owner = self._owner.get((finished.lane, finished.requester))
        if owner is None:
            # Demoted by a quota: find the class by requester alone.
            owner = next(
                (
                    name
                    for (_, requester), name in self._owner.items()
                    if requester == finished.requester
                ),
                "unknown",
            )
        self.finished.append((owner, finished))

    async def _closed_loop(self, cls: RequestClass, worker: int) -> None:
        rng = class_rng(self.scenario, cls, f"closed-{worker}")
        requester = cls.requesters[worker % len(cls.requesters)]
        index = 0
        while self.now() < self.scenario.duration_s:
            planned = PlannedRequest(
                class_name=cls.name,
                index=index,
                at_s=self.now(),
                requester=requester,
                prompt_tokens=cls.prompt_tokens.sample(rng),
                output_tokens=cls.output_tokens.sample(rng),
            )
            index += 1
            record = await self._send(planned, rng_stream=f"closed-{worker}-{index}")
            if record.outcome != "ok":
                # Refused or failed at once: back off one scenario second instead of spinning.
                await asyncio.sleep(1.0 / self.scale)

    def _request(self, planned: PlannedRequest, rng: random.Random) -> ChatRequest:
        """Return the planned request (naming no model over several servers: each runs its own)."""
        options: dict[str, Any] = {}
        if self.backend.profile.takes_ignore_eos:
            # Make the model produce exactly the planned number of tokens.
            options["ignore_eos"] = True
        cls = self._classes[planned.class_name]
        system = SYSTEM_PROMPT
        if cls.shared_prefix_tokens:
            prefix = self._prefixes[cls.prefix_group]
            share = cls.shared_prefix_tokens / max(
                other.shared_prefix_tokens
                for other in self.scenario.classes
                if other.prefix_group == cls.prefix_group
            )
            system = f"{prefix[: round(len(prefix) * share)]}\n{SYSTEM_PROMPT}"
        return ChatRequest(
            model=ANY_MODEL if self.several else self.server.model,
            messages=(
                ChatMessage(role="system", content=system),
                ChatMessage(
                    role="user",
                    content=prompt_text(
                        planned.prompt_tokens - _SYSTEM_TOKENS,
                        rng,
                        scale=self.prompt_scale,
                    ),
                ),
            ),
            max_tokens=planned.output_tokens,
            temperature=0.0,
            seed=self.scenario.seed,
            options=options,
        )

    def _stream(
        self, planned: PlannedRequest, request: ChatRequest
    ) -> AsyncIterator[StreamChunk]:
        assert self._target is not None
        return self._target.stream(
            request,
            lane=self._lane_of[planned.class_name],
            requester=planned.requester,
            prompt_tokens=planned.prompt_tokens
            + self._shared_prefix_tokens(planned.class_name),
        )

    async def _send(
        self, planned: PlannedRequest, rng_stream: str | None = None
    ) -> RequestRecord:
        rng = random.Random(
            f"{self.prompt_salt}{self.scenario.seed}:{planned.class_name}:"
            f"{rng_stream or planned.index}:prompt"
        )
        record = RequestRecord(
            class_name=planned.class_name,
            requester=planned.requester,
            sent_at=self.now(),
            planned_prompt_tokens=planned.prompt_tokens,
            planned_output_tokens=planned.output_tokens,
        )
        self.records.append(record)
        stream = self._stream(planned, self._request(planned, rng))
        try:
            async for chunk in stream:
                if chunk.text or chunk.output_tokens or chunk.tool_calls:
                    at = self.now()
                    if record.ttft_s is None:
                        record.ttft_s = at - record.sent_at
                    record.token_times.append(at)
                    record.token_counts.append(max(1, chunk.output_tokens))
                if chunk.done:
                    if chunk.usage is not None:
                        record.prompt_tokens = chunk.usage.prompt_tokens
                        record.output_tokens = chunk.usage.output_tokens
                        record.cached_prompt_tokens = chunk.usage.cached_prompt_tokens
                        usage = chunk.usage
                        if (
                            usage.cached_prompt_tokens is not None
                            or usage.evaluated_prompt_tokens is not None
                        ):
                            record.evaluated_prompt_tokens = (
                                usage.prompt_tokens_evaluated
                            )
                    break
            if not record.output_tokens:
                record.output_tokens = sum(record.token_counts)
            if not record.prompt_tokens:
                record.prompt_tokens = (
                    planned.prompt_tokens
                    + self._shared_prefix_tokens(planned.class_name)
                )
            record.e2e_s = self.now() - record.sent_at
            record.outcome = "ok"
        except asyncio.CancelledError:
            record.outcome = "cancelled"
            raise
        except NoServerError as err:
            # Not a refusal of the request: every server that may serve it is gone.
            record.outcome = "error"
            record.error = type(err).__name__
        except (SchedulerError, ServerBusyError) as err:
            record.outcome = "rejected"
            record.error = type(err).__name__
        except BackendError as err:
            record.outcome = "error"
            record.error = type(err).__name__
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        return record

    async def _sample(self, progress: Progress | None) -> None:
        while True:
            depth = self._target.queue_depth() if self._target is not None else 0
            for server in self.servers:
                try:
                    metrics = await server.backend.metrics()
                except BackendError:
                    continue
                depth += metrics.requests_waiting or 0
                if metrics.kv_cache_usage is not None:
                    self.kv_use_max = max(
                        self.kv_use_max or 0.0, metrics.kv_cache_usage
                    )
            self.queue_depth_max = max(self.queue_depth_max, depth)
            if progress is not None:
                progress(
                    self.now(), sum(1 for r in self.records if r.outcome != "pending")
                )
            # Twice a second: often enough for the maxima, light on the server under test.
            await asyncio.sleep(0.5)


class ProgressBar:
    """A one-line progress bar on a terminal (silent elsewhere or for short runs)."""

    def __init__(
        self, total_s: float, label: str, stream: TextIO | None = None
    ) -> None:
        """Draw to ``stream`` (stderr by default) only when it is a terminal."""
        self.total_s = total_s
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() and total_s > 3
        self._last = 0.0

    def __call__(self, elapsed_s: float, done: int) -> None:
        """Redraw (at most ten times a second)."""
        if not self.enabled or time.monotonic() - self._last < 0.1:
            return
        self._last = time.monotonic()
        fraction = min(1.0, elapsed_s / self.total_s)
        filled = int(fraction * 30)
        self.stream.write(
            f"\r{self.label:<24} [{'#' * filled}{'.' * (30 - filled)}] "
            f"{fraction:4.0%} {elapsed_s:6.1f}/{self.total_s:.0f} s  {done} done"
        )
        self.stream.flush()

    def close(self) -> None:
        """End the line."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
