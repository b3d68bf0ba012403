"""``scripts/bench run`` over two servers: in-process engines on virtual time, simulators over HTTP.

The engines replay the repository's own scenarios (``tools/bench/scenarios``: a minute of an
evening in well under a second, the same every run); the simulators a short scenario of the
same shape, in real time at five times their speed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from custom_components.llm_lanes.core.availability import PROBE_S
from tools.bench.__main__ import main
from tools.bench.figures import server_figures, servers_line
from tools.bench.servers import lane_servers, parse_server, runs_on_virtual_time


def _reports(out: Path) -> dict[str, dict[str, Any]]:
    return {
        run: json.loads((out / run / "report.json").read_text())
        for run in ("direct", "lanes")
    }


def test_engines_fail_over_when_the_faster_one_dies_and_return_to_it(
    tmp_path: Path,
) -> None:
    """`failover_evening` on two engines (the second four times slower), server 1 killed at 20 s.

    Through the pool nothing fails: answers that had begun resume on server 2, and routing
    returns to server 1 once it answers again. The reverse proxy (``direct``) fails the
    streams that were under way.
    """
    out = tmp_path / "out"
    code = main([
        "run", "--server", "engine", "--server", "engine:slower=4",
        "--scenario", "failover_evening", "--policy", "direct", "--policy", "lanes",
        "--idle", "voice", "--no-plots", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    reports = _reports(out)
    lanes, direct = reports["lanes"], reports["direct"]
    assert lanes["failed"] == 0
    assert lanes["resumed"] >= 1
    one, two = lanes["servers"]["1"], lanes["servers"]["2"]
    assert (one["kills"], one["starts"]) == (1, 1)
    assert one["off_s"] == pytest.approx(20, abs=0.5)
    assert one["off_s"] <= one["down_s"] <= one["off_s"] + PROBE_S + 0.5
    assert one["failovers_from"] == lanes["failovers"] == two["failovers_to"] >= 1
    assert two["resumed_here"] == lanes["resumed"]
    assert one["served_since_start"] >= 10  # routing came back to the preferred server
    assert two["served_total"] > 0
    assert one["asleep_s"] == 0 and two["down_s"] == 0
    assert direct["failed"] >= 1  # a stream under way cannot move on behind a proxy
    assert direct["servers"]["1"]["down_s"] is None  # no pool watched it
    assert direct["servers"]["2"]["failovers_to"] == direct["failovers"] >= 1
    comparison = json.loads((out / "comparison.json").read_text())["runs"]
    assert comparison["lanes"]["failed"] == 0
    assert comparison["lanes"]["voice"]["ttft_p95_vs_idle"] is not None
    markdown = (out / "lanes" / "report.md").read_text()
    assert "| 1 | llama_cpp `http://engine-1.lan:8080` |" in markdown
    assert "0 requests failed" in markdown
    pool = server_figures(out)
    assert set(pool) == {"direct", "lanes"}  # the idle run is on one server
    line = servers_line("lanes", pool["lanes"])
    assert line.startswith(f"lanes: failovers {lanes['failovers']}, resumed ")
    assert f"since its start, away {one['failovers_from']} / to 0, off 20 s" in line


def test_engines_wake_the_box_asleep_at_the_start(tmp_path: Path) -> None:
    """`waking_box`: summaries only server 1 may serve wake it; voice meanwhile goes to server 2."""
    out = tmp_path / "out"
    code = main([
        "run", "--server", "engine", "--server", "engine:slower=4,slots=2",
        "--scenario", "waking_box", "--policy", "direct", "--policy", "lanes",
        "--no-plots", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    reports = _reports(out)
    lanes, direct = reports["lanes"], reports["direct"]
    assert lanes["failed"] == 0
    one, two = lanes["servers"]["1"], lanes["servers"]["2"]
    assert two["slots"] == 2
    assert one["waking_s"] == pytest.approx(10, abs=1)  # the wake delay, then its start
    assert one["off_s"] == pytest.approx(one["waking_s"], abs=0.5)
    assert one["asleep_s"] < 1  # the first summary asks for the wake at once
    assert one["served"]["background"] > 0
    assert "background" not in two["served"]
    assert two["served"]["voice"] > 0  # answered during the wake
    assert one["served"]["voice"] > two["served"]["voice"]  # preferred once it is up
    assert direct["servers"]["1"]["served_total"] == 0  # a proxy wakes nothing
    assert direct["servers"]["1"]["off_s"] >= 60


def test_two_simulators_over_http(tmp_path: Path) -> None:
    """Two simulated servers over HTTP; the first is killed (its connections cut) and started again."""
    scenario = tmp_path / "pair.json"
    scenario.write_text(
        json.dumps({
            "name": "pair", "duration_s": 16, "warmup_s": 1, "seed": 4,
            "events": [
                {"at_s": 4, "server": 1, "action": "kill"},
                {"at_s": 7, "server": 1, "action": "start"},
            ],
            "classes": [
                {
                    "name": "voice", "lane": "voice",
                    "arrival": {"process": "poisson", "rate_per_s": 1.5},
                    "prompt_tokens": {"mean": 150}, "output_tokens": {"mean": 20},
                    "slo": {"ttft_s": 0.5, "itl_s": 0.1},
                },
                {
                    "name": "summaries", "lane": "background",
                    "arrival": {"process": "closed", "concurrency": 2},
                    "prompt_tokens": {"mean": 800}, "output_tokens": {"mean": 200},
                    "slo": {"ttft_s": 60, "itl_s": 1},
                },
            ],
        })
    )  # fmt: skip
    out = tmp_path / "out"
    code = main([
        "run", "--server", "sim", "--server", "sim:slower=3", "--sim-speed", "5",
        "--scenario", str(scenario), "--policy", "direct", "--policy", "lanes",
        "--no-plots", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    reports = _reports(out)
    lanes = reports["lanes"]
    assert lanes["failed"] == 0
    one, two = lanes["servers"]["1"], lanes["servers"]["2"]
    assert (one["kills"], one["starts"]) == (1, 1)
    assert one["url"].startswith("http://127.0.0.1:")
    assert one["failovers_from"] >= 1 and two["served_total"] > 0
    assert one["served_since_start"] > 0
    direct = reports["direct"]["servers"]["1"]
    assert (direct["kills"], direct["starts"]) == (1, 1)


def test_server_options_are_checked(tmp_path: Path) -> None:
    """Every mistake in --server, --lane-servers or the mix of servers is a clear error (exit 2)."""
    assert parse_server("engine:slots=2,costs=cpu").options == {
        "slots": "2",
        "costs": "cpu",
    }
    assert parse_server("http://127.0.0.1:8080").url == "http://127.0.0.1:8080"
    for text, message in (
        ("gpu-box", "expected a URL"),
        ("sim:speed=2", "unknown key 'speed'"),
        ("engine:slots", "expected KEY=VALUE"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_server(text)
    with pytest.raises(ValueError, match="every --server must be engine"):
        runs_on_virtual_time([parse_server("engine"), parse_server("sim")])
    assert lane_servers(["background=1", "voice=2,1"]) == {
        **lane_servers(["background=1"]),
        **lane_servers(["voice=2,1"]),
    }
    for item in ("urgent=1", "voice=0", "voice"):
        with pytest.raises(ValueError, match="--lane-servers"):
            lane_servers([item])
    out = ["--duration", "2", "--no-plots", "--out", str(tmp_path / "out")]
    assert (
        main(
            [
                "run",
                "--server",
                "engine",
                "--server",
                "sim",
                "--scenario",
                "waking_box",
                *out,
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "run",
                "--server",
                "engine",
                "--scenario",
                "waking_box",
                "--lane-servers",
                "voice=2",
                *out,
            ]
        )
        == 2
    )
    assert (
        main(["run", "--server", "engine:costs=tpu", "--scenario", "waking_box", *out])
        == 2
    )
    assert (
        main(
            [
                "sweep",
                "--server",
                "engine",
                "--server",
                "engine",
                "--scenario",
                "evening",
                *out,
            ]
        )
        == 2
    )
    assert main(["run", "--server", "engine", "--scenario", "waking_box", *out]) == 0
