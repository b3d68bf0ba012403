"""Sliding windows, percentiles and per-request ITL."""

from __future__ import annotations

import pytest

from custom_components.llm_lanes.core.metrics import (
    GroupStats,
    Percentiles,
    RateWindow,
    SampleWindow,
    percentile,
    request_itl_p95,
)


def test_percentile_interpolates() -> None:
    """Percentiles interpolate linearly between closest ranks."""
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == pytest.approx(50.5)
    assert percentile(values, 0.99) == pytest.approx(99.01)
    assert percentile([3.0], 0.95) == 3.0
    with pytest.raises(ValueError):
        percentile([], 0.5)
    assert Percentiles.of([]) == Percentiles()


def test_sample_window_drops_old_samples() -> None:
    """Only samples inside the window count."""
    window = SampleWindow()
    for t in range(10):
        window.add(float(t), float(t))
    assert window.values(9.0, 3.0) == [6.0, 7.0, 8.0, 9.0]


def test_rate_window_sums_recent_amounts() -> None:
    """The rate window forgets amounts older than the window."""
    rate = RateWindow()
    rate.add(0.0, 5, 10.0)
    rate.add(5.0, 7, 10.0)
    assert rate.total(9.0, 10.0) == 12
    assert rate.total(12.0, 10.0) == 7
    assert rate.total(30.0, 10.0) == 0


def test_group_stats_goodput() -> None:
    """Goodput is the share of the window's finished requests that met their objectives."""
    stats = GroupStats()
    for t, good in [(0.0, True), (1.0, False), (2.0, True), (3.0, True)]:
        stats.record_finished(
            t,
            counts_for_goodput=True,
            good=good,
            queue_wait_s=0.1,
            ttft_s=0.2,
            e2e_s=1.0,
            prompt_tokens=10,
            output_tokens=5,
        )
    stats.record_finished(
        3.0,
        counts_for_goodput=False,
        good=False,
        queue_wait_s=None,
        ttft_s=None,
        e2e_s=0.5,
        prompt_tokens=0,
        output_tokens=0,
    )
    view = stats.view(3.0, 10.0)
    assert view.finished_in_window == 4
    assert view.goodput == pytest.approx(0.75)
    assert view.good_per_s == pytest.approx(0.3)
    assert stats.finished_total == 5
    later = stats.view(11.5, 10.0)
    assert later.finished_in_window == 2
    assert later.ttft.p50 == pytest.approx(0.2)


def test_request_itl_p95() -> None:
    """One slow gap among many barely moves the p95; none means no ITL."""
    assert request_itl_p95([]) is None
    assert request_itl_p95([0.01] * 99 + [1.0]) == pytest.approx(0.01, abs=1e-9)
