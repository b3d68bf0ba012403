"""The servers a ``scripts/bench`` command runs against, from its ``--server`` options.

``--server`` is repeatable; the servers are numbered from 1 in the order given (the scenario's
events, ``--lane-servers`` and the report name them so), and a run over two or more goes through
a pool (``core/bench/targets.py``):

- ``--server URL``: a running server, its kind detected;
- ``--server sim[:KEY=VALUE,...]``: the simulated server over HTTP, in the benchmark's process;
- ``--server engine[:KEY=VALUE,...]``: the simulator's engine in-process on virtual time (a
  scenario of minutes in seconds, the same every run); every ``--server`` is ``engine`` then.

A simulated server's keys (their defaults are the ``--sim-*`` options): ``kind``
(``llama_cpp``/``ollama``), ``slots``, ``costs`` (a profile of ``tools/simulator/costs.py``:
``gpu-published``, ``gpu``, ``gpu-fa-off``, ``cpu``), ``host-cache`` (``off``: the server runs
with ``--cache-ram 0``), ``slower`` (every iteration costs this many times as much: a smaller
machine), and for ``sim`` also ``seed``, ``kv-capacity``,
``prefill-chunk``. ``--sim-speed`` is the run's time scale, the same for every simulated server
(and 1 beside a real server): ``slower`` makes one server slower than another.

A server the scenario kills, starts or puts to sleep (``Scenario.switches_servers``) needs a
switch: ``engine`` cuts its power (``tools/simulator/box.py``), ``sim`` is killed and restarted
(``SimulatedServer.kill``, ``restart``), a URL is the process listening on its port on this machine
(``processes.LocalProcess``) or the commands ``--server-kill N=CMD`` and ``--server-start N=CMD``
(``processes.ShellCommands``). Without one the command fails before anything runs.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Mapping, Sequence
import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import aiohttp

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.backends.detect import connect
from custom_components.llm_lanes.core.bench.runner import describe_server
from custom_components.llm_lanes.core.bench.servers import BenchServer, PowerSwitch
from custom_components.llm_lanes.core.lanes import Lane
from tools.bench.processes import LocalProcess, ShellCommands
from tools.simulator.box import Box
from tools.simulator.engine import COSTS, EngineCosts
from tools.simulator.options import sim_config
from tools.simulator.server import SimConfig, SimulatedServer

SIM = "sim"
ENGINE = "engine"
"""``--server engine``: the simulator's engine in-process, on virtual time."""
ENGINE_KEYS = frozenset({"kind", "slots", "costs", "host-cache", "slower"})
SIM_KEYS = ENGINE_KEYS | {"seed", "kv-capacity", "prefill-chunk"}

type Source = Literal["url", "sim", "engine"]


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One ``--server`` option."""

    source: Source
    url: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)


def parse_server(text: str) -> ServerSpec:
    """Parse one ``--server`` value (ValueError naming what is wrong)."""
    head, sep, rest = text.partition(":")
    if head in (SIM, ENGINE):
        allowed = SIM_KEYS if head == SIM else ENGINE_KEYS
        options: dict[str, str] = {}
        for item in rest.split(",") if sep and rest else ():
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not value.strip():
                raise ValueError(f"--server {text}: expected KEY=VALUE, got {item!r}")
            if key not in allowed:
                raise ValueError(
                    f"--server {text}: unknown key {key!r} (keys: {', '.join(sorted(allowed))})"
                )
            options[key] = value.strip()
        return ServerSpec(source="sim" if head == SIM else "engine", options=options)
    if head in ("http", "https") and rest.startswith("//"):
        return ServerSpec(source="url", url=text)
    raise ValueError(
        f"--server {text}: expected a URL (http://host:port), sim[:KEY=VALUE,...] or engine[:KEY=VALUE,...]"
    )


def runs_on_virtual_time(specs: Sequence[ServerSpec]) -> bool:
    """Whether the servers run on virtual time (all ``engine``); ValueError if only some do."""
    engines = [spec.source == ENGINE for spec in specs]
    if any(engines) and not all(engines):
        raise ValueError(
            "--server engine runs on virtual time: every --server must be engine then"
        )
    return bool(engines) and all(engines)


def numbered_commands(items: Sequence[str] | None, option: str) -> dict[int, str]:
    """Parse ``N=CMD`` options (``--server-kill``, ``--server-start``)."""
    commands: dict[int, str] = {}
    for item in items or ():
        number, sep, command = item.partition("=")
        if not sep or not number.strip().isdigit() or not command.strip():
            raise ValueError(f"{option} expects N=COMMAND; got {item!r}")
        commands[int(number)] = command
    return commands


def lane_servers(items: Sequence[str] | None) -> dict[Lane, tuple[int, ...]]:
    """Parse ``--lane-servers LANE=N[,N...]`` (servers by number, most preferred first)."""
    routes: dict[Lane, tuple[int, ...]] = {}
    for item in items or ():
        key, sep, numbers = item.partition("=")
        try:
            lane = Lane.from_key(key.strip())
        except ValueError as err:
            raise ValueError(f"--lane-servers {item}: {err}") from None
        parts = [part.strip() for part in numbers.split(",")] if sep else []
        if not parts or not all(part.isdigit() and int(part) >= 1 for part in parts):
            raise ValueError(
                f"--lane-servers expects LANE=N[,N...] with server numbers from 1; got {item!r}"
            )
        routes[lane] = tuple(int(part) for part in parts)
    return routes


@dataclass(slots=True)
class Fleet:
    """The servers of one command, and what it started that outlives it."""

    servers: list[BenchServer]
    time_scale: float
    processes: dict[str, LocalProcess] = field(default_factory=dict)

    def left_running(self) -> list[str]:
        """Say which servers the benchmark restarted and left running (to stop them later)."""
        return [
            f"server {name} ({process.url}) was restarted by the benchmark and runs on as "
            f"PID {pid} (log {process.log}); stop it with: kill {pid}"
            for name, process in self.processes.items()
            if (pid := process.restarted) is not None
        ]


@contextlib.asynccontextmanager
async def open_servers(
    args: argparse.Namespace, *, switched: frozenset[int], logs: Path
) -> AsyncIterator[Fleet]:
    """Start the simulated servers, connect to the others, give a switch to those ``switched``.

    ``args`` are the command's (``--server``, ``--sim-*``, ``--model``, ``--api-key``,
    ``--server-kill``, ``--server-start``); the logs of processes it starts go under ``logs``.
    """
    specs = [parse_server(text) for text in args.server]
    kills = numbered_commands(getattr(args, "server_kill", None), "--server-kill")
    starts = numbered_commands(getattr(args, "server_start", None), "--server-start")
    for number in sorted(set(kills) ^ set(starts)):
        raise ValueError(
            f"server {number}: give both --server-kill and --server-start, or neither"
        )
    for number in sorted({*kills, *switched}):
        if number > len(specs):
            raise ValueError(f"there is no server {number}: {len(specs)} given")
    if (
        any(spec.source == "url" for spec in specs)
        and args.sim_speed != 1
        and any(spec.source == SIM for spec in specs)
    ):
        raise ValueError(
            "--sim-speed compresses the run's time: beside a real server it must be 1"
        )
    async with contextlib.AsyncExitStack() as stack:
        fleet = Fleet(
            servers=[],
            time_scale=args.sim_speed
            if any(spec.source == SIM for spec in specs)
            else 1.0,
        )
        session: aiohttp.ClientSession | None = None
        for number, spec in enumerate(specs, start=1):
            name = str(number)
            switch: PowerSwitch | None = None
            backend: Backend
            if spec.source == ENGINE:
                box = Box(
                    f"engine-{name}",
                    costs=_costs(args, spec),
                    slots=int(spec.options.get("slots", args.sim_slots)),
                    chooses_slots=spec.options.get("kind", args.sim_kind)
                    == "llama_cpp",
                )
                backend, switch = box, _box_switch(box)
            else:
                if session is None:
                    session = await stack.enter_async_context(
                        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
                    )
                url = spec.url
                if spec.source == SIM:
                    sim = await stack.enter_async_context(
                        SimulatedServer(_sim_config(args, spec))
                    )
                    url, switch = sim.url, PowerSwitch(kill=sim.kill, start=sim.restart)
                assert url is not None
                backend = await connect(session, url, api_key=args.api_key)
                log = logs / f"server-{name}.log"
                if number in kills:
                    switch = ShellCommands(kills[number], starts[number], log).switch()
                elif spec.source == "url" and number in switched:
                    process = LocalProcess(url, log)
                    fleet.processes[name] = process
                    switch = process.switch()
            fleet.servers.append(
                BenchServer(
                    name=name,
                    backend=backend,
                    description=await describe_server(backend, args.model),
                    switch=switch,
                )
            )
        yield fleet


def _box_switch(box: Box) -> PowerSwitch:
    async def kill() -> None:
        box.kill()

    async def start() -> None:
        box.power_on()

    return PowerSwitch(kill=kill, start=start)


def _costs(args: argparse.Namespace, spec: ServerSpec) -> EngineCosts:
    """Return a simulated server's costs: its ``costs``, without the host cache, times ``slower``."""
    name = spec.options.get("costs", args.sim_costs)
    if name not in COSTS:
        raise ValueError(f"costs={name}: one of {', '.join(sorted(COSTS))}")
    costs = COSTS[name]
    host_cache = spec.options.get("host-cache", "on")
    if host_cache not in ("on", "off"):
        raise ValueError(f"host-cache={host_cache}: on or off")
    if host_cache == "off":
        costs = costs.without_host_cache()
    return costs.scaled(_number(spec.options.get("slower", "1"), "slower"))


def _sim_config(args: argparse.Namespace, spec: ServerSpec) -> SimConfig:
    """Return the ``SimConfig`` of a ``sim`` server: the ``--sim-*`` options and its own keys."""
    changes: dict[str, Any] = {"costs": _costs(args, spec)}
    options = spec.options
    if "kind" in options:
        if options["kind"] not in ("llama_cpp", "ollama"):
            raise ValueError(f"kind={options['kind']}: llama_cpp or ollama")
        changes["kind"] = options["kind"]
    for key, attribute in (
        ("slots", "slots"),
        ("seed", "seed"),
        ("kv-capacity", "kv_capacity_tokens"),
        ("prefill-chunk", "prefill_chunk_tokens"),
    ):
        if key in options:
            value = int(_number(options[key], key))
            changes[attribute] = (
                value or None if attribute == "prefill_chunk_tokens" else value
            )
    return replace(sim_config(args, "sim-"), **changes)


def _number(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{key}={text}: not a number") from None
    if value <= 0 and key != "prefill-chunk":
        raise ValueError(f"{key}={text}: must be above 0")
    return value
