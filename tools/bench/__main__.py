"""Command line of the benchmark: ``scripts/bench run|sweep|curve|micro ...`` (``python -m tools.bench``).

scripts/bench run --server sim --scenario voice_vs_background \
        --policy direct --policy lanes --idle voice --out /tmp/bench
scripts/bench run --server URL1 --server URL2 --scenario failover_evening \
        --policy direct --policy lanes --idle voice --out /tmp/pool   (several servers: servers.py)
scripts/bench sweep --server sim --scenario rag_heavy \
        --grid max_sequences=2,4,8 --grid prefill_budget=1024,8192 --out /tmp/sweep
scripts/bench curve --server sim --out /tmp/curve   (the server's batch curve)
scripts/bench ablate --server engine:costs=gpu --scenario assist_evening \
        --scenario voice_vs_background --out /tmp/ablation   (each mechanism on and off)
scripts/bench frontier --server engine:costs=gpu --scenario assist_evening --out /tmp/frontier
        (voice TTFT p95 against background tokens/s over the knobs; the defaults' place)
scripts/bench micro ...      (the scheduler's micro-benchmark)
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Sequence
import contextlib
from dataclasses import dataclass
import functools
import json
import logging
from pathlib import Path
import secrets
import sys
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.report import (
    build_report,
    markdown_report,
    plot_goodput,
    plot_ttft_cdf,
    write_report,
)
from custom_components.llm_lanes.core.bench.runner import (
    POLICIES,
    BenchPolicy,
    ProgressBar,
    RunResult,
    run_servers,
    settings_for_server,
)
from custom_components.llm_lanes.core.bench.servers import (
    ServerDescription,
    ServerLostError,
)
from custom_components.llm_lanes.core.bench.sweep import (
    SweepRow,
    format_table,
    parse_grid,
    run_sweep,
)
from custom_components.llm_lanes.core.bench.workload import (
    Scenario,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
)
from custom_components.llm_lanes.core.errors import BackendConnectionError
from custom_components.llm_lanes.core.settings import SchedulerSettings
from tools.bench.ablation import ablation_dict, ablation_markdown, run_ablation
from tools.bench.frontier import (
    DEFAULT_GRID,
    FrontierPoint,
    frontier_dict,
    frontier_markdown,
    map_frontier,
)
from tools.bench.servers import (
    lane_servers,
    open_servers,
    parse_server,
    runs_on_virtual_time,
)
from tools.simulator.options import add_sim_options
from tools.simulator.virtual_time import VirtualTimeLoop

SCENARIO_DIR = Path(__file__).parent / "scenarios"
"""Scenarios of the repository only (``--scenario NAME`` finds them too)."""


@dataclass(slots=True)
class Target:
    """The one server a ``sweep`` or ``curve`` runs against."""

    backend: Backend
    server: ServerDescription
    time_scale: float


@contextlib.asynccontextmanager
async def open_target(args: argparse.Namespace) -> AsyncIterator[Target]:
    """Start the simulator if asked, detect the server and build its client (one ``--server``)."""
    if len(args.server) != 1:
        raise ValueError(f"{args.command} runs against one --server")
    async with open_servers(args, switched=frozenset(), logs=Path(args.out)) as fleet:
        (server,) = fleet.servers
        yield Target(
            backend=server.backend,
            server=server.description,
            time_scale=fleet.time_scale,
        )


async def wait_idle(backend: Backend, time_scale: float, limit_s: float = 60.0) -> None:
    """Wait until the server runs nothing (between runs), at most ``limit_s``.

    A server that does not answer runs nothing to wait for.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s / time_scale
    while loop.time() < deadline:
        try:
            metrics = await backend.metrics()
        except BackendConnectionError:
            return
        except Exception:  # noqa: BLE001 - a server without metrics: wait out the limit
            pass
        else:
            if not metrics.requests_running and not metrics.slots_busy:
                return
        await asyncio.sleep(0.2)


def _settings(args: argparse.Namespace, server: ServerDescription) -> SchedulerSettings:
    """Return the settings a household gets with this server, changed by ``--set``."""
    values: dict[str, str] = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value; got {item!r}")
        values[key.strip()] = value.strip()
    return settings_for_server(server).with_values(values)


def _scenario(args: argparse.Namespace) -> Scenario:
    return _named_scenario(args.scenario, args.duration)


def _named_scenario(source: str | Path, duration: float | None) -> Scenario:
    if not Path(source).exists() and (SCENARIO_DIR / f"{source}.json").exists():
        source = SCENARIO_DIR / f"{source}.json"
    scenario = load_scenario(source)
    if duration is not None:
        from custom_components.llm_lanes.core.bench.calibrate import shorten  # noqa: PLC0415

        scenario = shorten(scenario, duration)
    return scenario


async def _run(args: argparse.Namespace) -> int:
    scenario = _scenario(args)
    routes = lane_servers(args.lane_servers)
    policies: list[BenchPolicy] = args.policy or ["lanes"]
    idle = {name.strip() for name in args.idle.split(",")} if args.idle else set()
    out = Path(args.out)
    runs: list[tuple[str, Scenario, BenchPolicy]] = []
    if idle:
        # The idle baseline: those classes alone on the first server, up throughout.
        runs.append(("idle", scenario.only(idle).steady(), "direct"))
    runs += [(policy, scenario, policy) for policy in policies]
    single = len(runs) == 1
    # Fresh prompt text for every run of every invocation: a server's prompt cache must not
    # answer one run's prefill with an earlier run's identical prompts.
    salt = secrets.token_hex(4)
    results: list[tuple[str, RunResult]] = []
    async with open_servers(
        args, switched=scenario.switches_servers, logs=out
    ) as fleet:
        settings = [_settings(args, server.description) for server in fleet.servers]
        for label, run_scenario_, policy in runs:
            servers = fleet.servers[:1] if label == "idle" else fleet.servers
            for server in fleet.servers:
                await wait_idle(server.backend, fleet.time_scale)
            bar = ProgressBar(run_scenario_.duration_s, label)
            result = await run_servers(
                servers,
                run_scenario_,
                policy=policy,
                settings=settings[: len(servers)],
                lane_servers=None if label == "idle" else routes,
                time_scale=fleet.time_scale,
                prompt_scale=args.prompt_scale,
                prompt_salt=f"{salt}:{label}:",
                progress=bar,
            )
            bar.close()
            report = write_report(
                result, out if single else out / label, plots=not args.no_plots
            )
            print(markdown_report(report).replace(f"policy `{policy}`", f"`{label}`"))
            results.append((label, result))
        for line in fleet.left_running():
            print(line)
    if not single:
        comparison = compare(
            [(label, build_report(result)) for label, result in results], idle
        )
        (out / "comparison.json").write_text(
            json.dumps(comparison, indent=2) + "\n", encoding="utf-8"
        )
        (out / "comparison.md").write_text(
            comparison_markdown(comparison), encoding="utf-8"
        )
        print(comparison_markdown(comparison))
        if not args.no_plots:
            # The full runs first (their classes make the panels), the idle baseline last.
            ordered = sorted(results, key=lambda item: _is_idle(item[1], scenario))
            plot_ttft_cdf(
                [result for _, result in ordered],
                out / "ttft_cdf.png",
                labels=[label for label, _ in ordered],
            )
    print(f"reports in {out}")
    return 0


def _is_idle(result: RunResult, scenario: Scenario) -> bool:
    return len(result.scenario.classes) != len(scenario.classes)


def compare(
    reports: Sequence[tuple[str, dict[str, Any]]], idle: set[str]
) -> dict[str, Any]:
    """Ratios between runs of one invocation: each policy against the idle baseline and direct."""
    by_label = dict(reports)
    baseline = by_label.get("idle")
    direct = by_label.get("direct")
    result: dict[str, Any] = {"runs": {}}
    for label, report in reports:
        if label == "idle":
            continue
        entry: dict[str, Any] = {
            "output_tok_s": report["output_tok_s"],
            "goodput": report["goodput"],
        }
        if "servers" in report:
            entry["failovers"] = report["failovers"]
            entry["failed"] = report["failed"]
            entry["served"] = {
                name: server["served_total"]
                for name, server in report["servers"].items()
            }
        for name, stats in report["classes"].items():
            cls: dict[str, Any] = {
                "ttft_p95": stats["ttft_p95"],
                "itl_p95": stats["itl_p95"],
            }
            if baseline is not None and name in idle:
                base = baseline["classes"][name]
                cls["ttft_p95_vs_idle"] = _ratio(stats["ttft_p95"], base["ttft_p95"])
                cls["itl_p95_vs_idle"] = _ratio(stats["itl_p95"], base["itl_p95"])
            if direct is not None and name not in idle:
                cls["output_tok_s"] = _class_tok_s(report, name)
                cls["output_tok_s_vs_direct"] = _ratio(
                    _class_tok_s(report, name), _class_tok_s(direct, name)
                )
            entry[name] = cls
        result["runs"][label] = entry
    return result


_RUN_FIGURES = frozenset({"output_tok_s", "goodput", "failovers", "failed", "served"})
"""The keys of a run's comparison entry that are not classes."""


def _class_tok_s(report: dict[str, Any], name: str) -> float:
    return float(report["classes"][name]["output_tok_s"])


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return value / base


def comparison_markdown(comparison: dict[str, Any]) -> str:
    """Render the comparison as a small Markdown list."""
    lines = ["# Comparison", ""]
    for label, entry in comparison["runs"].items():
        lines.append(
            f"## {label}: {entry['output_tok_s']:.0f} output tok/s, goodput {entry['goodput'] or 0:.0%}"
        )
        if "served" in entry:
            served = ", ".join(
                f"server {name} {count}" for name, count in entry["served"].items()
            )
            lines.append(
                f"- requests served: {served}; failovers {entry['failovers']}, "
                f"failed {entry['failed']}"
            )
        for name, cls in entry.items():
            if not isinstance(cls, dict) or name in _RUN_FIGURES:
                continue
            parts = [f"TTFT p95 {_s(cls['ttft_p95'])}", f"ITL p95 {_s(cls['itl_p95'])}"]
            for key, text in (
                ("ttft_p95_vs_idle", "TTFT p95 vs idle"),
                ("itl_p95_vs_idle", "ITL p95 vs idle"),
                ("output_tok_s_vs_direct", "tok/s vs direct"),
            ):
                if cls.get(key) is not None:
                    parts.append(f"{text} {cls[key]:.2f}x")
            lines.append(f"- {name}: " + ", ".join(parts))
        lines.append("")
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f} ms"


async def _sweep(args: argparse.Namespace) -> int:
    scenario = _scenario(args)
    grid = parse_grid(args.grid or [])
    policies: list[BenchPolicy] = args.policy or ["lanes"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def progress_for(label: str) -> ProgressBar:
        return ProgressBar(scenario.duration_s, label[:24])

    def on_row(row: SweepRow) -> None:
        print(
            f"{row.label:<48} goodput {row.goodput:5.0%}  {row.output_tok_s:7.0f} tok/s",
            flush=True,
        )

    async with open_target(args) as target:
        settings = _settings(args, target.server)
        result = await run_sweep(
            target.backend,
            scenario,
            policies=policies,
            base_settings=settings,
            grid=grid,
            server=target.server,
            time_scale=target.time_scale,
            prompt_scale=args.prompt_scale,
            progress_for=progress_for,
            on_row=on_row,
        )
    table = format_table(result)
    summary = (
        f"Best goodput: {result.best_goodput.label}\n"
        f"Most tokens/s: {result.best_throughput.label}\n{result.explanation}\n"
    )
    print(f"\n{table}\n\n{summary}")
    (out / "sweep.md").write_text(
        f"# Sweep of {scenario.name}\n\n{table}\n\n{summary}", encoding="utf-8"
    )
    (out / "sweep.json").write_text(
        json.dumps(
            {
                "scenario": scenario.name,
                "rows": [row.as_dict() for row in result.rows],
                "best_goodput": result.best_goodput.label,
                "best_throughput": result.best_throughput.label,
                "explanation": result.explanation,
                "reports": [row.report for row in result.rows],
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    if not args.no_plots:
        plot_goodput([row.as_dict() for row in result.rows], out / "goodput.png")
        plot_ttft_cdf(
            [result.best_goodput.result, result.best_throughput.result],
            out / "ttft_cdf.png",
            labels=[
                f"best goodput: {result.best_goodput.label}",
                f"most tok/s: {result.best_throughput.label}",
            ],
        )
    print(f"sweep written to {out}")
    return 0


async def _curve(args: argparse.Namespace) -> int:
    from custom_components.llm_lanes.core.bench.curve import (  # noqa: PLC0415
        measure_curve,
        plot_curve,
        svg_plot,
        text_plot,
    )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    async with open_target(args) as target:
        sequences = args.sequences or target.server.slots or 4
        curve = await measure_curve(
            target.backend,
            target.server.model,
            sequences,
            time_scale=target.time_scale,
        )
    (out / "curve.json").write_text(
        json.dumps(curve.as_dict(), indent=2) + "\n", encoding="utf-8"
    )
    (out / "curve.svg").write_text(svg_plot(curve), encoding="utf-8")
    if not args.no_plots:
        plot_curve(curve, out / "curve.png")
    prefill = f"{curve.prefill_tok_s:.0f}" if curve.prefill_tok_s else "–"
    print(text_plot(curve))
    print(f"prefill {prefill} tok/s · knee at {curve.knee()} sequences")
    print(f"curve written to {out}")
    return 0


def _bar(duration_s: float, label: str) -> ProgressBar:
    return ProgressBar(duration_s, label[:24])


async def _ablate(args: argparse.Namespace) -> int:
    scenarios = [_named_scenario(name, args.duration) for name in args.scenario]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = ", ".join(args.server)
    sections: list[str] = []
    found: list[dict[str, Any]] = []
    async with open_target(args) as target:
        settings = _settings(args, target.server)
        for scenario in scenarios:
            await wait_idle(target.backend, target.time_scale)
            ablation = await run_ablation(
                target.backend,
                scenario,
                server=target.server,
                base_settings=settings,
                seeds=args.seeds,
                time_scale=target.time_scale,
                prompt_scale=args.prompt_scale,
                progress_for=functools.partial(_bar, scenario.duration_s),
                between=functools.partial(wait_idle, target.backend, target.time_scale),
            )
            section = ablation_markdown(ablation, profile)
            print(section, flush=True)
            sections.append(section)
            found.append(ablation_dict(ablation))
    (out / "ablation.md").write_text(
        f"# Ablation on {profile}\n\n" + "\n".join(sections), encoding="utf-8"
    )
    (out / "ablation.json").write_text(
        json.dumps({"server": profile, "scenarios": found}, indent=2) + "\n",
        encoding="utf-8",
    )
    print(f"ablation written to {out}")
    return 0


async def _frontier(args: argparse.Namespace) -> int:
    scenarios = [_named_scenario(name, args.duration) for name in args.scenario]
    grid = parse_grid(args.grid) if args.grid else DEFAULT_GRID
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = ", ".join(args.server)
    sections: list[str] = []
    found: list[dict[str, Any]] = []

    def on_point(point: FrontierPoint) -> None:
        p95 = point.figures.voice_ttft_p95
        print(
            f"{point.label:<60} voice p95 {_s(p95):>8}  background "
            f"{point.background:7.1f} tok/s",
            flush=True,
        )

    async with open_target(args) as target:
        settings = _settings(args, target.server)
        for scenario in scenarios:
            await wait_idle(target.backend, target.time_scale)
            points = await map_frontier(
                target.backend,
                scenario,
                server=target.server,
                base_settings=settings,
                grid=grid,
                seeds=args.seeds,
                time_scale=target.time_scale,
                prompt_scale=args.prompt_scale,
                on_point=on_point,
                between=functools.partial(wait_idle, target.backend, target.time_scale),
            )
            section = frontier_markdown(points, f"{scenario.name} on {profile}")
            print(section, flush=True)
            sections.append(section)
            found.append(frontier_dict(scenario.name, points))
    (out / "frontier.md").write_text(
        f"# Frontier on {profile}\n\n" + "\n".join(sections), encoding="utf-8"
    )
    (out / "frontier.json").write_text(
        json.dumps({"server": profile, "scenarios": found}, indent=2) + "\n",
        encoding="utf-8",
    )
    print(f"frontier written to {out}")
    return 0


def _add_server(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        required=True,
        action="append",
        help=(
            "base URL of the LLM server, 'sim[:KEY=VALUE,...]' (the simulated server), or "
            "'engine[:KEY=VALUE,...]' (its engine in-process, on virtual time); keys: kind, "
            "slots, costs, slower (and for sim seed, kv-capacity, prefill-chunk). Repeat it "
            "(run only) to route the scenario over several servers, numbered from 1"
        ),
    )
    parser.add_argument("--model", help="model to use (default: each server's first)")
    parser.add_argument("--api-key")
    parser.add_argument("--out", required=True, help="folder for reports and plots")
    parser.add_argument("--no-plots", action="store_true")
    add_sim_options(parser, "sim-")


def _add_common(parser: argparse.ArgumentParser) -> None:
    _add_server(parser)
    parser.add_argument(
        "--scenario", required=True,
        help=(
            f"scenario file, or a built-in name ({', '.join(builtin_scenarios())}) or one of "
            f"tools/bench/scenarios ({', '.join(sorted(p.stem for p in SCENARIO_DIR.glob('*.json')))})"
        ),
    )  # fmt: skip
    parser.add_argument(
        "--policy", action="append", choices=POLICIES, help="repeat to compare policies"
    )
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="scheduler setting override"
    )
    parser.add_argument(
        "--duration", type=float, help="override the scenario's duration_s"
    )
    parser.add_argument(
        "--prompt-scale", type=float, default=1.0,
        help="stretch prompt text by this factor (tokenizers that pack more than 4 characters a token)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """Build the parser of the ``run``, ``sweep``, ``curve`` and ``micro`` commands."""
    parser = argparse.ArgumentParser(
        prog="scripts/bench", description="LLM Lanes goodput benchmark"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="replay a scenario and write reports")
    _add_common(run)
    run.add_argument(
        "--idle",
        help="comma-separated classes to also run alone, as the idle baseline (on the first server)",
    )
    run.add_argument(
        "--lane-servers", action="append", metavar="LANE=N[,N...]",
        help="the servers that may serve a lane, most preferred first (default: every server, in order)",
    )  # fmt: skip
    run.add_argument(
        "--server-kill", action="append", metavar="N=COMMAND",
        help="shell command that kills server N (default: SIGKILL to the local process on its port)",
    )  # fmt: skip
    run.add_argument(
        "--server-start", action="append", metavar="N=COMMAND",
        help="shell command that starts server N again (default: the killed process's command line)",
    )  # fmt: skip
    sweep = commands.add_parser(
        "sweep", help="run a grid of settings and print the frontier"
    )
    _add_common(sweep)
    sweep.add_argument(
        "--grid", action="append", metavar="KEY=V1,V2", help="setting values to sweep"
    )
    curve = commands.add_parser(
        "curve", help="measure ITL and tokens/s against sequences in flight"
    )
    _add_server(curve)
    curve.add_argument(
        "--sequences", type=int, help="largest batch (default: the server's slots)"
    )
    for name, text in (
        ("ablate", "run each voice-first mechanism on and off against the defaults"),
        ("frontier", "map voice TTFT p95 against background tokens/s over the knobs"),
    ):
        command = commands.add_parser(name, help=text)
        _add_server(command)
        command.add_argument(
            "--scenario", required=True, action="append", help="repeat for several"
        )
        command.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="scheduler setting override",
        )
        command.add_argument("--duration", type=float, help="override each duration_s")
        command.add_argument("--prompt-scale", type=float, default=1.0)
        command.add_argument(
            "--seeds", type=int, default=1,
            help="run each setting with this many seeds and pool them (a p95 of 40+ voice commands each)",
        )  # fmt: skip
        if name == "frontier":
            command.add_argument(
                "--grid", action="append", metavar="KEY=V1,V2",
                help="knob values (default: headroom, prefill_step_s, prefill_guard_tokens, background_share)",
            )  # fmt: skip
    commands.add_parser("micro", help="the scheduler's micro-benchmark", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["micro"]:
        from tools.bench.micro import main as micro_main  # noqa: PLC0415  (only this command needs it)

        return micro_main(arguments[1:])
    args = build_parser().parse_args(arguments)
    # What the pool and the benchmark's power switches warn of (a server that did not start).
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    command = {
        "run": _run,
        "curve": _curve,
        "sweep": _sweep,
        "ablate": _ablate,
        "frontier": _frontier,
    }[args.command]
    try:
        # The in-process engine runs on virtual time: a scenario of minutes in seconds, the
        # same way every time, whatever else the machine does.
        virtual = runs_on_virtual_time([parse_server(text) for text in args.server])
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    factory = VirtualTimeLoop if virtual else None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(command(args))
    except (ScenarioError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ServerLostError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
