"""Service per requester in the window, and Jain's index over the backlogged requesters."""

from __future__ import annotations

import pytest

from custom_components.llm_lanes.core.bench.fairness import (
    backlogged_share,
    fairness,
    jain,
    service,
)
from custom_components.llm_lanes.core.bench.runner import RequestRecord
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings

SETTINGS = SchedulerSettings(input_weight=1.0, output_weight=2.0)


def _record(
    requester: str, sent: float, first: float, tokens: int, *, done: bool = True
) -> RequestRecord:
    """Build a request with ``tokens`` output tokens one second apart from ``first`` on."""
    record = RequestRecord(
        class_name="jobs", requester=requester, sent_at=sent,
        planned_prompt_tokens=10, planned_output_tokens=tokens,
    )  # fmt: skip
    record.token_times = [first + i for i in range(tokens)]
    record.token_counts = [1] * tokens
    record.prompt_tokens = 10
    if done:
        record.outcome = "ok"
        record.e2e_s = first + tokens - 1 - sent
    return record


def test_jain() -> None:
    """1 for equal amounts, 1/n when one requester gets everything, None below two."""
    assert jain([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain([6.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain([5.0]) is None
    assert jain([0.0, 0.0]) is None


def test_service_counts_partial_service_inside_the_window() -> None:
    """Prompt when the first token came in the window, each output token that came in it."""
    # First token at 5, tokens at 5..14; window 8..20: 7 output tokens, the prompt before it.
    record = _record("a", 4.0, 5.0, 10)
    assert service(record, SETTINGS, 8.0, 20.0) == pytest.approx(2.0 * 7)
    # Still running at the end of a window 0..9: prompt 10 + tokens 5..9 (5) x 2.
    running = _record("b", 4.0, 5.0, 100, done=False)
    assert service(running, SETTINGS, 0.0, 9.0) == pytest.approx(10 + 2.0 * 5)


def test_backlogged_share_merges_overlapping_requests() -> None:
    """The share of the window with at least one request outstanding."""
    first = _record("a", 0.0, 1.0, 5)  # outstanding 0..5
    second = _record("a", 3.0, 4.0, 5)  # outstanding 3..8
    assert backlogged_share([first, second], 0.0, 10.0) == pytest.approx(0.8)
    unfinished = _record("a", 2.0, 3.0, 50, done=False)  # outstanding from 2 to the end
    assert backlogged_share([unfinished], 0.0, 10.0) == pytest.approx(0.8)


def test_jain_over_backlogged_requesters_of_each_lane() -> None:
    """Requesters that were not backlogged (a short request) do not count."""
    records = [
        _record("heavy", 0.0, 0.5, 30, done=False),
        _record("light", 0.0, 0.5, 10, done=False),
        _record("once", 0.0, 0.5, 2),  # outstanding 1.5 s of 20: not backlogged
    ]
    result = fairness(records, {"jobs": Lane.BACKGROUND}, SETTINGS, 0.0, 20.0)
    assert set(result["requesters"]) == {"heavy", "light", "once"}
    assert result["requesters"]["once"]["backlogged_share"] < 0.9
    heavy = result["requesters"]["heavy"]["service"]
    light = result["requesters"]["light"]["service"]
    assert (heavy, light) == (10 + 2.0 * 20, 10 + 2.0 * 10)
    expected = (heavy + light) ** 2 / (2 * (heavy**2 + light**2))
    assert result["jain_backlogged_by_lane"]["background"] == pytest.approx(expected)
    assert result["jain_backlogged"] == pytest.approx(expected)
