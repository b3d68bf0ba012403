"""The simulator against the real server: the measured evenings replayed on the engine.

``python -m tools.simulator.fidelity [--costs gpu-fa-off] [--policy direct] [--host-cache off]``
replays the two household evenings measured on an H200 llama-server (``measured/``: the
scenarios, their durations and the reports of the run) on the simulator's engine, on virtual
time, and prints beside each measured figure what the simulator gives: voice's TTFT p50 and p95,
the background requests finished, and what the server did in the measured window (the share of
it the loop was blocked between iterations, task launches, host-cache saves and loads, prefill
steps and their mean size). The fidelity test (``tests/core/test_sim_fidelity.py``) holds the
``direct`` figures within ``TOLERANCE`` of the measured ones on ``gpu-fa-off``.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from pathlib import Path
import re
from typing import Any

from custom_components.llm_lanes.core.bench.calibrate import shorten
from custom_components.llm_lanes.core.bench.report import build_report
from custom_components.llm_lanes.core.bench.runner import (
    POLICIES,
    BenchPolicy,
    describe_server,
    run_servers,
    settings_for_server,
)
from custom_components.llm_lanes.core.bench.servers import BenchServer
from custom_components.llm_lanes.core.bench.workload import load_scenario
from tools.simulator.box import Box
from tools.simulator.costs import COSTS, EngineCosts
from tools.simulator.engine import EngineStats
from tools.simulator.virtual_time import VirtualTimeLoop

MEASURED = Path(__file__).parent / "measured"
EVENINGS = {"assist_loaded": 80.0, "voice_loaded": 70.0}
"""The measured household evenings and how long each ran (seconds)."""
TOLERANCE = 0.30
"""How far the simulator may land from a measured figure (a share of it)."""
_SECONDS = {"ms": 0.001, "s": 1.0}


@dataclass(frozen=True, slots=True)
class Figures:
    """What one evening gave under one policy, measured or simulated."""

    voice_ttft_p50_s: float
    voice_ttft_p95_s: float
    background_finished: int


@dataclass(frozen=True, slots=True)
class ServerWork:
    """What the simulated server did in the measured window."""

    window_s: float
    blocked_s: float
    host_cache_s: float
    launches: int
    saves: int
    loads: int
    prefill_steps: int
    prefill_step_tokens: int

    @property
    def blocked_share(self) -> float:
        """The share of the window the loop was blocked between iterations."""
        return self.blocked_s / self.window_s

    @property
    def mean_step_tokens(self) -> float | None:
        """The prompt tokens a prefill step evaluated, on average (None: no steps)."""
        if not self.prefill_steps:
            return None
        return self.prefill_step_tokens / self.prefill_steps


@dataclass(frozen=True, slots=True)
class Replay:
    """One evening replayed on the simulator under one policy."""

    evening: str
    policy: BenchPolicy
    figures: Figures
    work: ServerWork


def measured(evening: str, policy: BenchPolicy) -> Figures:
    """Read the measured figures of an evening from its report (``measured/*-POLICY.md``)."""
    text = (MEASURED / f"{evening}-{policy}.md").read_text(encoding="utf-8")
    rows = {
        cells[0]: cells
        for line in text.splitlines()
        if line.startswith("| ")
        and (cells := [cell.strip() for cell in line.strip("|").split("|")])
    }
    voice, background = rows["voice"], rows["background"]
    return Figures(
        voice_ttft_p50_s=_seconds(voice[4]),
        voice_ttft_p95_s=_seconds(voice[5]),
        background_finished=int(background[2]),
    )


def _seconds(cell: str) -> float:
    match = re.fullmatch(r"([\d.,]+) (ms|s)", cell)
    if match is None:
        raise ValueError(f"not a duration: {cell!r}")
    return float(match[1].replace(",", "")) * _SECONDS[match[2]]


def _stats_delta(
    before: EngineStats, after: EngineStats, window_s: float
) -> ServerWork:
    return ServerWork(
        window_s=window_s,
        blocked_s=after.blocked_seconds_total - before.blocked_seconds_total,
        host_cache_s=after.host_cache_seconds_total - before.host_cache_seconds_total,
        launches=after.launches_total - before.launches_total,
        saves=after.saves_total - before.saves_total,
        loads=after.loads_total - before.loads_total,
        prefill_steps=after.prefill_steps_total - before.prefill_steps_total,
        prefill_step_tokens=after.prefill_step_tokens_total
        - before.prefill_step_tokens_total,
    )


async def _replay(evening: str, policy: BenchPolicy, costs: EngineCosts) -> Replay:
    scenario = shorten(load_scenario(MEASURED / f"{evening}.json"), EVENINGS[evening])
    box = Box("measured", costs=costs, slots=4)
    description = await describe_server(box, None)
    engine = box.server.engine
    loop = asyncio.get_running_loop()
    start = loop.time()
    snapshots: dict[str, EngineStats] = {}

    def snapshot(name: str) -> None:
        snapshots[name] = EngineStats(
            **{key: getattr(engine.stats, key) for key in EngineStats.__slots__}
        )

    loop.call_at(start + scenario.warmup_s, snapshot, "from")
    loop.call_at(start + scenario.duration_s, snapshot, "to")
    result = await run_servers(
        [BenchServer(name="1", backend=box, description=description)],
        scenario,
        policy=policy,
        settings=[settings_for_server(description)],
        prompt_salt=f"{evening}:{policy}:",
    )
    await engine.stop()
    report = build_report(result)
    voice, background = report["classes"]["voice"], report["classes"]["background"]
    return Replay(
        evening=evening,
        policy=policy,
        figures=Figures(
            voice_ttft_p50_s=voice["ttft_p50"],
            voice_ttft_p95_s=voice["ttft_p95"],
            background_finished=background["finished"],
        ),
        work=_stats_delta(
            snapshots["from"],
            snapshots["to"],
            scenario.duration_s - scenario.warmup_s,
        ),
    )


def replay(evening: str, policy: BenchPolicy, costs: EngineCosts) -> Replay:
    """Replay a measured evening on the engine, on virtual time (seconds of wall time)."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(_replay(evening, policy, costs))


def within(simulated: float, real: float, tolerance: float = TOLERANCE) -> bool:
    """Whether a simulated figure lands within ``tolerance`` of the measured one."""
    return abs(simulated - real) <= tolerance * abs(real)


def table(replays: list[Replay]) -> str:
    """Return the replays beside the measured figures, as a Markdown table."""
    lines = [
        (
            "| evening | policy | voice TTFT p50 sim / real | voice TTFT p95 sim / real "
            "| background finished sim / real | loop blocked | launches | saves / loads "
            "| prefill steps (mean tokens) |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for item in replays:
        real = measured(item.evening, item.policy)
        sim, work = item.figures, item.work
        step = work.mean_step_tokens
        lines.append(
            f"| {item.evening} | {item.policy} "
            f"| {_ms(sim.voice_ttft_p50_s)} / {_ms(real.voice_ttft_p50_s)} "
            f"| {_ms(sim.voice_ttft_p95_s)} / {_ms(real.voice_ttft_p95_s)} "
            f"| {sim.background_finished} / {real.background_finished} "
            f"| {work.blocked_share:.0%} | {work.launches} | {work.saves} / {work.loads} "
            f"| {work.prefill_steps}"
            f"{'' if step is None else f' ({step:.0f})'} |"
        )
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    """Print the replays of the measured evenings beside the measured figures."""
    parser = argparse.ArgumentParser(prog="python -m tools.simulator.fidelity")
    parser.add_argument("--costs", choices=sorted(COSTS), default="gpu-fa-off")
    parser.add_argument("--host-cache", choices=["on", "off"], default="on")
    parser.add_argument(
        "--policy", action="append", choices=sorted(POLICIES), default=None
    )
    parser.add_argument(
        "--evening", action="append", choices=sorted(EVENINGS), default=None
    )
    args = parser.parse_args(argv)
    costs: Any = COSTS[args.costs]
    if args.host_cache == "off":
        costs = costs.without_host_cache()
    replays = [
        replay(evening, policy, costs)
        for evening in args.evening or sorted(EVENINGS)
        for policy in args.policy or ["direct", "lanes"]
    ]
    print(f"costs={args.costs} host-cache={args.host_cache}")
    print(table(replays))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
