"""report.json schema and the figures in it, from hand-made runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from custom_components.llm_lanes.core.bench.report import (
    build_report,
    markdown_report,
    percentile,
    write_report,
)
from custom_components.llm_lanes.core.bench.runner import (
    RequestRecord,
    RunResult,
    ServerRun,
)
from custom_components.llm_lanes.core.bench.servers import (
    BenchServer,
    ServerDescription,
    ServerTally,
)
from custom_components.llm_lanes.core.bench.workload import parse_scenario
from custom_components.llm_lanes.core.settings import SchedulerSettings
from tools.simulator.box import Box

SCENARIO = parse_scenario(
    {
        "name": "hand",
        "duration_s": 20,
        "warmup_s": 2,
        "classes": [
            {
                "name": "voice", "lane": "voice", "requesters": ["a", "b"],
                "arrival": {"process": "poisson", "rate_per_s": 1},
                "prompt_tokens": {"mean": 100}, "output_tokens": {"mean": 4},
                "slo": {"ttft_s": 0.5, "itl_s": 0.1},
            },
        ],
    }
)  # fmt: skip

CLASS_KEYS = {
    "count", "finished", "rejected", "preempted", "ttft_p50", "ttft_p90", "ttft_p95", "ttft_p99",
    "itl_p50", "itl_p95", "itl_p99", "itl_max", "e2e_p50", "e2e_p95", "queue_wait_p95",
    "prompt_tokens", "prompt_tokens_evaluated", "prompt_tokens_cached", "output_tokens",
    "goodput", "good_per_s",
}  # fmt: skip
TOP_KEYS = {
    "scenario", "policy", "settings", "server", "duration_s", "output_tok_s", "prompt_tok_s",
    "classes", "queue_depth_max", "kv_use_max", "jain_index", "fairness",
}  # fmt: skip


def _record(
    requester: str, sent: float, ttft: float | None, gap: float, outcome: str = "ok"
) -> RequestRecord:
    record = RequestRecord(
        class_name="voice", requester=requester, sent_at=sent,
        planned_prompt_tokens=100, planned_output_tokens=4, outcome=outcome,
    )  # fmt: skip
    if ttft is not None:
        record.ttft_s = ttft
        record.token_times = [sent + ttft + i * gap for i in range(4)]
        record.token_counts = [1] * 4
        record.e2e_s = ttft + 3 * gap
        record.prompt_tokens = 100
        record.output_tokens = 4
    return record


def _result() -> RunResult:
    records = [
        _record("a", 1.0, 0.1, 0.05),  # in the warm-up: not counted in the class
        _record("a", 3.0, 0.2, 0.05),  # good
        _record("b", 5.0, 0.9, 0.05),  # TTFT too slow
        _record("a", 7.0, 0.2, 0.30),  # ITL too slow
        _record("b", 9.0, None, 0.0, outcome="rejected"),
        _record("a", 11.0, 0.3, 0.02),  # good
    ]
    return RunResult(
        scenario=SCENARIO, policy="lanes", settings=SchedulerSettings(),
        server=ServerDescription(kind="llama_cpp", version="b1", model="m", slots=4),
        records=records, finished=[], queue_depth_max=3, kv_use_max=0.25, wall_s=20.0,
    )  # fmt: skip


def test_report_schema_and_goodput() -> None:
    """Every field of the issue's schema is there, and goodput counts both objectives."""
    report = build_report(_result())
    assert set(report) >= TOP_KEYS
    assert set(report["server"]) == {"kind", "version", "model", "slots"}
    voice = report["classes"]["voice"]
    assert set(voice) >= CLASS_KEYS
    assert (voice["count"], voice["finished"], voice["rejected"]) == (5, 4, 1)
    assert voice["goodput"] == pytest.approx(2 / 4)
    assert voice["good_per_s"] == pytest.approx(2 / 18)
    assert report["goodput"] == pytest.approx(
        2 / 5
    )  # the rejected request counts against it
    assert voice["ttft_p50"] == pytest.approx(0.25)
    assert voice["itl_max"] == pytest.approx(0.30)
    assert voice["output_tokens"] == 16
    assert report["duration_s"] == 18
    assert report["output_tok_s"] == pytest.approx(
        4 * 4 / 18
    )  # the warm-up request's tokens land before 2 s
    assert report["settings"]["lanes"]["voice"]["ttft_slo_s"] == 0.5
    assert report["settings"]["policy"] == "lanes"
    json.dumps(report)


def test_percentile_interpolates() -> None:
    """Linear interpolation between ranks; None without samples."""
    assert percentile([], 50) is None
    assert percentile([1.0], 95) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)


def test_write_report_files(tmp_path: Path) -> None:
    """report.json, report.csv, report.md and the TTFT plot are written."""
    write_report(_result(), tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["policy"] == "lanes"
    with (tmp_path / "report.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["class"] == "voice"
    assert rows[0]["finished"] == "4"
    assert "| voice | 5 | 4 | 1 |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "ttft_cdf.png").read_bytes()[:4] == b"\x89PNG"


async def test_a_run_over_two_servers_lists_them() -> None:
    """``servers`` names each with what it did; failovers count once; ``failed`` counts refusals too.

    ``failed``: every request after the warm-up that got no answer (an error or a refusal), not
    those cut off by the end of the run.
    """
    result = _result()
    result.records += [
        _record("a", 12.0, None, 0.0, outcome="error"),
        _record(
            "b", 13.0, None, 0.0, outcome="cancelled"
        ),  # cut off by the end of the run
        _record("a", 1.5, None, 0.0, outcome="error"),  # in the warm-up
    ]
    one, two = ServerTally(), ServerTally()
    one.serve("voice")
    one.failovers_from, two.failovers_to, two.resumed_here = 2, 2, 1
    one.off_s, one.kills, one.starts, one.state_s = (
        20.0,
        1,
        1,
        {"up": 30.0, "down": 21.0},
    )
    two.serve("voice")
    two.serve("background")
    description = ServerDescription(kind="llama_cpp", version="b1", model="m", slots=4)
    boxes = {"1": Box("box1"), "2": Box("box2")}
    result.servers = tuple(
        ServerRun(
            BenchServer(name=name, backend=boxes[name], description=description), tally
        )
        for name, tally in (("1", one), ("2", two))
    )
    for box in boxes.values():
        await box.server.engine.stop()
    report = build_report(result)
    assert (report["failovers"], report["resumed"], report["failed"]) == (2, 1, 2)
    first = report["servers"]["1"]
    assert first["url"] == "http://box1.lan:8080"
    assert (first["served"], first["served_total"], first["down_s"]) == (
        {"voice": 1},
        1,
        21.0,
    )
    assert report["servers"]["2"]["served"] == {"voice": 1, "background": 1}
    markdown = markdown_report(report)
    assert "Servers (whole run): 2 failovers, 1 answers resumed on another server, 2 requests failed." in markdown  # fmt: skip
    assert (
        "| 1 / 0 / 0 / 1 |" in markdown
    )  # server 2: voice / interactive / automation / background
    assert "| 20 s | 21 s / 0 s / 0 s |" in markdown
    assert "servers" not in build_report(
        _result()
    )  # one server: the report is as before
