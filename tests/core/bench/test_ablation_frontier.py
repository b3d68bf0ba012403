"""The ablation and the frontier: verdicts, dominance, the defaults' place, and runs on the engine."""

from __future__ import annotations

import json
from pathlib import Path

from custom_components.llm_lanes.core.settings import SchedulerSettings
from tools.bench.__main__ import main
from tools.bench.ablation import MECHANISMS, LaneFigures, Mechanism, Verdict
from tools.bench.frontier import FrontierPoint, mark_frontier, position


def _figures(voice_p95: float | None, background: float) -> LaneFigures:
    return LaneFigures(
        voice_ttft_p50=None,
        voice_ttft_p95=voice_p95,
        voice_itl_p95=None,
        voice_finished=50,
        background_tok_s=background,
    )


def _verdict(with_it: LaneFigures, without_it: LaneFigures) -> str:
    return Verdict(Mechanism("m", {}), with_it, without_it).word


def test_verdicts_weigh_both_lanes_and_ignore_noise() -> None:
    """Voice faster at no background cost pays; faster at a cost is a trade; within 5 % is none."""
    assert _verdict(_figures(0.1, 100), _figures(0.2, 100)) == "pays"
    assert _verdict(_figures(0.1, 80), _figures(0.2, 100)) == "trade"
    assert _verdict(_figures(0.2, 80), _figures(0.1, 100)) == "costs"
    assert _verdict(_figures(0.102, 98), _figures(0.1, 100)) == "no effect"
    assert _verdict(_figures(0.1, 120), _figures(0.1, 100)) == "pays"


def test_every_mechanism_switches_a_real_setting() -> None:
    """Each switch parses into the settings and differs from the default."""
    defaults = SchedulerSettings()
    for mechanism in MECHANISMS:
        switched = defaults.with_values(mechanism.switched)
        assert switched != defaults, mechanism.name


def _point(
    voice_p95: float, background: float, *, defaults: bool = False
) -> FrontierPoint:
    return FrontierPoint(
        {"headroom": str(voice_p95)}, _figures(voice_p95, background), defaults
    )


def test_the_frontier_and_the_defaults_place() -> None:
    """Dominated points are off the frontier; the defaults' gains are read off the others."""
    defaults = _point(0.2, 100, defaults=True)
    faster = _point(0.1, 100)  # beats the defaults: same background, lower p95
    richer = _point(0.3, 150)
    worse = _point(0.4, 90)
    points = [defaults, faster, richer, worse]
    mark_frontier(points)
    assert [p.frontier for p in points] == [False, True, True, False]
    where = position(points)
    assert where.voice_gain == 2.0
    assert where.best_voice is faster
    assert where.background_gain == 1.0
    assert not where.near

    alone = [_point(0.2, 100, defaults=True), _point(0.21, 105)]
    mark_frontier(alone)
    assert all(p.frontier for p in alone)
    assert position(alone).near


def test_ablate_on_the_engine_writes_every_mechanism(tmp_path: Path) -> None:
    """A short ablation on the simulator's engine: every mechanism judged, lanes ahead of direct."""
    out = tmp_path / "ablation"
    code = main([
        "ablate", "--server", "engine", "--scenario", "voice_vs_background",
        "--duration", "40", "--no-plots", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    (found,) = json.loads((out / "ablation.json").read_text())["scenarios"]
    assert set(found["mechanisms"]) == {m.name for m in MECHANISMS}
    runs = {run["label"]: run for run in found["runs"]}
    assert len(runs) == 3 + len(MECHANISMS)
    assert (
        runs["direct"]["voice_finished"] == runs["lanes (defaults)"]["voice_finished"]
    )
    # Voice behind a bare server's long prompts against voice in its lane.
    assert runs["lanes (defaults)"]["voice_ttft_p95"] < runs["direct"]["voice_ttft_p95"]
    assert "| preemption |" in (out / "ablation.md").read_text()


def test_frontier_on_the_engine_places_the_defaults(tmp_path: Path) -> None:
    """A two-point grid: the defaults and the grid's runs, the frontier marked, a verdict written."""
    out = tmp_path / "frontier"
    code = main([
        "frontier", "--server", "engine", "--scenario", "voice_vs_background",
        "--duration", "40", "--grid", "preemption=false,true", "--no-plots",
        "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    (found,) = json.loads((out / "frontier.json").read_text())["scenarios"]
    assert [p["label"] for p in found["points"]] == [
        "defaults",
        "preemption=false",
        "preemption=true",
    ]
    assert any(p["frontier"] for p in found["points"])
    assert "Defaults:" in (out / "frontier.md").read_text()
