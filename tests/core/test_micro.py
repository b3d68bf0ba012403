"""The scheduler micro-benchmark runs and reports both hot paths (figures go to the README)."""

from __future__ import annotations

import pytest

from tools.bench import micro


def test_micro_prints_both_operations(capsys: pytest.CaptureFixture[str]) -> None:
    """A small run prints a row per operation with its target; without --check it exits 0."""
    assert (
        micro.main(["--queued", "400", "--requesters", "10", "--iterations", "2000"])
        == 0
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["operation", "median", "us", "p99/max", "us", "target"]
    assert lines[1].startswith("choose-next (400 queued, 10 requesters, 4 lanes)")
    assert lines[2].startswith("per-token accounting")
    for line in lines[1:]:
        assert line.split()[-1] in {"ok", "MISSED"}


def test_choose_keeps_the_queue_full() -> None:
    """Every timed choice returns a cost; the queue never runs dry while being measured."""
    costs = micro.bench_choose(queued=200, requesters=5, iterations=300)
    assert len(costs) == 300
    assert all(cost > 0 for cost in costs)
