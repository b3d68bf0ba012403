"""The runner and the sweep against the simulated server, with the real backend and scheduler.

What measures speed (the sweep, the batch curve, the calibration) runs on the simulator's engine
on virtual time, so its figures are the cost model's whatever the machine's load; the runner's
replay runs against the simulator over HTTP.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.backends.detect import connect
from custom_components.llm_lanes.core.bench.calibrate import (
    CalibrationResult,
    calibrate,
)
from custom_components.llm_lanes.core.bench.report import build_report
from custom_components.llm_lanes.core.bench.runner import (
    RunResult,
    describe_server,
    run_scenario,
)
from custom_components.llm_lanes.core.bench.servers import ServerDescription
from custom_components.llm_lanes.core.bench.sweep import (
    SweepResult,
    SweepRow,
    mark_frontier,
    pick,
    run_sweep,
)
from custom_components.llm_lanes.core.bench.workload import (
    Scenario,
    parse_scenario,
    plan_open_requests,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings
from tests.core.boxes import run_virtual
from tools.bench.__main__ import compare, comparison_markdown, main
from tools.simulator.engine import GPU_COSTS, EngineCosts
from tools.simulator.inprocess import EngineBackend
from tools.simulator.server import SimConfig, SimulatedServer

StartSim = Callable[[SimConfig], Awaitable[SimulatedServer]]


def _scenario(**arrival: Any) -> dict[str, Any]:
    return {
        "name": "tiny",
        "duration_s": 2.0,
        "warmup_s": 0.1,
        "seed": 3,
        "classes": [
            {
                "name": "chat", "lane": "interactive", "requesters": ["u1", "u2"],
                "arrival": arrival,
                "prompt_tokens": {"mean": 60, "std": 5, "min": 40, "max": 80},
                "output_tokens": {"mean": 10, "std": 0, "min": 10, "max": 10},
                "slo": {"ttft_s": 100, "itl_s": 0.035},
            }
        ],
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class FastSim:
    """A simulator at 20 times real speed, and a backend connected to it."""

    sim: SimulatedServer
    backend: Backend
    server: ServerDescription

    async def run_direct(
        self, scenario: Scenario, *, prompt_salt: str = ""
    ) -> RunResult:
        """Replay ``scenario`` straight to the simulator and let every request finish."""
        return await run_scenario(
            self.backend, scenario, policy="direct", settings=SchedulerSettings(),
            server=self.server, time_scale=20, prompt_salt=prompt_salt,
            drain_s=600.0,  # a loaded machine lags at speed 20: let every request finish
        )  # fmt: skip


@pytest.fixture
async def fast_sim(start_sim: StartSim, session: aiohttp.ClientSession) -> FastSim:
    """Start a simulator at speed 20 and connect a backend to it."""
    sim = await start_sim(SimConfig(speed=20))
    backend = await connect(session, sim.url)
    return FastSim(sim, backend, await describe_server(backend, None))


def _poisson(duration_s: float) -> Scenario:
    """Return the tiny scenario, two requests a second for ``duration_s``."""
    return parse_scenario(
        _scenario(process="poisson", rate_per_s=2) | {"duration_s": duration_s}
    )


async def test_direct_run_sends_the_planned_requests(fast_sim: FastSim) -> None:
    """Every planned open-loop request is sent once and gets exactly its planned output tokens."""
    scenario = _poisson(40.0)
    result = await fast_sim.run_direct(scenario)
    planned = plan_open_requests(scenario)
    assert len(result.records) == len(planned)
    assert [(r.outcome, r.error) for r in result.records if r.outcome != "ok"] == []
    assert [r.output_tokens for r in result.records] == [10] * len(planned)
    assert sorted(r.prompt_tokens for r in result.records) == sorted(
        p.prompt_tokens for p in planned
    )
    report = build_report(result)
    assert report["server"]["kind"] == "llama_cpp"
    assert report["classes"]["chat"]["finished"] == sum(
        1 for p in planned if p.at_s >= 0.1
    )


def test_sweep_picks_goodput_over_throughput() -> None:
    """Four sequences move more tokens but break the ITL objective; the sweep recommends one.

    The cost model is exaggerated (20 ms a token alone, 50 ms with four in the batch) so the
    objective of 35 ms sits far from both; the engine runs on virtual time, the same every run.
    """
    costs = EngineCosts(fixed_s=0.01, per_prefill_token_s=0.0001, per_decode_seq_s=0.01)

    async def sweep() -> SweepResult:
        backend = EngineBackend(costs=costs)
        return await run_sweep(
            backend,
            parse_scenario(
                _scenario(process="closed", concurrency=4) | {"duration_s": 3.0}
            ),
            policies=["lanes"],
            base_settings=SchedulerSettings(),
            grid={"max_sequences": ["1", "4"]},
            server=await describe_server(backend, None),
        )

    result = run_virtual(sweep)
    by_setting = {row.overrides["max_sequences"]: row for row in result.rows}
    assert by_setting["4"].output_tok_s > by_setting["1"].output_tok_s
    assert by_setting["1"].goodput > by_setting["4"].goodput
    assert result.best_throughput is by_setting["4"]
    assert result.best_goodput is by_setting["1"]
    assert "lanes max_sequences=4 moves the most tokens" in result.explanation
    assert all(row.frontier for row in result.rows)


def test_cli_run_writes_the_reports(tmp_path: Path) -> None:
    """`scripts/bench run --server sim` writes report.json, csv, md and a plot."""
    path = tmp_path / "tiny.json"
    path.write_text(
        json.dumps(
            _scenario(process="burst", every_s=0.5, size=2) | {"duration_s": 10.0}
        )
    )
    code = main([
        "run", "--server", "sim", "--sim-speed", "20", "--scenario", str(path),
        "--policy", "direct", "--set", "max_sequences=2", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["policy"] == "direct"
    assert report["settings"]["max_sequences"] == 2
    assert report["classes"]["chat"]["count"] == 38
    assert (tmp_path / "out" / "ttft_cdf.png").exists()
    assert (
        main(["run", "--server", "sim", "--scenario", "nope", "--out", str(tmp_path)])
        == 2
    )


def test_cli_curve_writes_the_batch_curve(tmp_path: Path) -> None:
    """``curve`` measures every batch size up to the slots asked for and draws it."""
    out = tmp_path / "curve"
    code = main([
        "curve", "--server", "engine", "--sim-slots", "2", "--no-plots", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    curve = json.loads((out / "curve.json").read_text())
    # The engine on virtual time: its costs, measured exactly, the same every run.
    one, two = curve["points"]
    assert (one["sequences"], two["sequences"]) == (1, 2)
    assert one["itl_p50_s"] == pytest.approx(
        GPU_COSTS.fixed_s + GPU_COSTS.per_decode_seq_s
    )
    assert two["itl_p50_s"] == pytest.approx(
        GPU_COSTS.fixed_s + 2 * GPU_COSTS.per_decode_seq_s
    )
    assert two["output_tok_s"] > one["output_tok_s"]
    assert curve["prefill_tok_s"] == pytest.approx(1 / GPU_COSTS.per_prefill_token_s)
    assert (out / "curve.svg").read_text().startswith("<svg")
    assert not (out / "curve.png").exists()


def test_calibrate_recommends_and_skips_impossible_settings() -> None:
    """Settings above the server's slot count are not tried; the answer is plain JSON.

    The current settings (max sequences 1) are one of the rows, so nothing more is run. The
    engine runs on virtual time: the curve it measures is its cost model's, every run.
    """

    async def run() -> CalibrationResult:
        return await calibrate(
            EngineBackend(slots=2),
            SchedulerSettings(max_sequences=1),
            scenario=parse_scenario(_scenario(process="closed", concurrency=2)),
            grid={"max_sequences": ["1", "16"]},
            duration_s=1.5,
        )

    result = run_virtual(run)
    assert [row["settings"] for row in result.rows] == [{"max_sequences": "1"}]
    assert result.current_values == {"max_sequences": "1"}
    values = result.recommended_values
    assert (values["max_sequences"], values["headroom"]) == ("1", "0")
    # The engine prefills 1 / 0.15 ms = 6,667 tokens/s: 667 within voice's 100 ms objective,
    # in steps of 64.
    voice_itl_s = SchedulerSettings().lanes[Lane.VOICE].itl_slo_s
    guard = voice_itl_s / GPU_COSTS.per_prefill_token_s
    assert int(values["prefill_guard_tokens"]) == round(guard / 64) * 64
    assert result.recommended.max_sequences == 1
    assert result.curve is not None
    assert [point.sequences for point in result.curve.points] == [1, 2]
    one, two = result.curve.points
    assert two.output_tok_s > one.output_tok_s  # a GPU-like server: batching pays
    response = result.as_response()
    assert response["curve"]["knee"] in {1, 2}
    assert "seq" in response["curve_plot"]
    assert json.loads(json.dumps(response)) == response
    assert "nothing to trade" in response["explanation"]


def test_compare_gives_ratios_against_idle_and_direct() -> None:
    """The comparison divides each policy's figures by the idle run's and by direct's."""

    def report(
        voice_ttft: float, voice_itl: float, bg_tok_s: float | None
    ) -> dict[str, Any]:
        classes: dict[str, Any] = {
            "voice": {"ttft_p95": voice_ttft, "itl_p95": voice_itl, "output_tok_s": 1.0}
        }
        if bg_tok_s is not None:
            classes["bg"] = {"ttft_p95": 1.0, "itl_p95": 0.02, "output_tok_s": bg_tok_s}
        return {"output_tok_s": 100.0, "goodput": 0.5, "classes": classes}

    comparison = compare(
        [
            ("idle", report(0.04, 0.010, None)),
            ("direct", report(3.0, 0.015, 200.0)),
            ("lanes", report(0.06, 0.014, 180.0)),
        ],
        {"voice"},
    )
    lanes = comparison["runs"]["lanes"]
    assert lanes["voice"]["ttft_p95_vs_idle"] == pytest.approx(1.5)
    assert lanes["voice"]["itl_p95_vs_idle"] == pytest.approx(1.4)
    assert lanes["bg"]["output_tok_s_vs_direct"] == pytest.approx(0.9)
    assert comparison["runs"]["direct"]["voice"]["ttft_p95_vs_idle"] == pytest.approx(
        75
    )
    assert "idle" not in comparison["runs"]
    assert "TTFT p95 vs idle 1.50x" in comparison_markdown(comparison)


def test_pick_prefers_the_faster_of_equal_goodputs() -> None:
    """The highest goodput wins even by half a point; only an exact tie goes to tokens/s."""

    def row(value: str, goodput: float, tok_s: float) -> SweepRow:
        report = {"goodput": goodput, "output_tok_s": tok_s}
        return SweepRow(
            policy="lanes", overrides={"x": value}, report=report, result=None
        )  # type: ignore[arg-type]

    rows = [row("a", 0.945, 97), row("b", 0.940, 135), row("c", 0.86, 164)]
    best_goodput, best_throughput = pick(rows)
    assert best_goodput.overrides == {"x": "a"}
    assert best_throughput.overrides == {"x": "c"}
    tied = [row("a", 0.94, 97), row("b", 0.94, 135)]
    assert pick(tied)[0].overrides == {"x": "b"}
    mark_frontier(rows)
    assert [r.frontier for r in rows] == [True, True, True]
    rows.append(row("d", 0.80, 150))
    mark_frontier(rows)
    assert rows[-1].frontier is False


async def test_prompt_salt_changes_text_not_length(fast_sim: FastSim) -> None:
    """Runs with different salts send other prompt text of the same length (no prompt-cache hits)."""
    scenario = _poisson(4.0)

    async def prompts(salt: str) -> list[str]:
        fast_sim.sim.requests_seen.clear()
        await fast_sim.run_direct(scenario, prompt_salt=salt)
        return [body["messages"][-1]["content"] for body in fast_sim.sim.requests_seen]

    first, again, other = await prompts("a:"), await prompts("a:"), await prompts("b:")
    assert first
    assert sorted(again) == sorted(first)
    assert sorted(map(len, other)) == sorted(map(len, first))
    assert not set(other) & set(first)
