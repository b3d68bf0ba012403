"""Scheduler settings: lane edits and ``key=value`` overrides (the benchmark's ``--set``)."""

from __future__ import annotations

import pytest

from custom_components.llm_lanes.core.lanes import DEFAULT_LANE_LIMITS, Lane
from custom_components.llm_lanes.core.settings import (
    Policy,
    QuotaAction,
    SchedulerSettings,
)


def test_with_values_parses_each_type() -> None:
    """Strings become the type of the setting they replace; the original is untouched."""
    base = SchedulerSettings()
    changed = base.with_values(
        {
            "max_sequences": "8",
            "background_share": "0.25",
            "preemption": "off",
            "background_paused": "yes",
            "policy": "fifo",
            "quota_action": "reject",
            "voice.ttft_slo_s": "0.3",
            "interactive.max_concurrency": "2",
            "background.max_concurrency": "none",
        }
    )
    assert changed.max_sequences == 8
    assert changed.background_share == 0.25
    assert changed.preemption is False
    assert changed.background_paused is True
    assert changed.policy is Policy.FIFO
    assert changed.quota_action is QuotaAction.REJECT
    assert changed.lanes[Lane.VOICE].ttft_slo_s == 0.3
    assert changed.lanes[Lane.INTERACTIVE].max_concurrency == 2
    assert changed.lanes[Lane.BACKGROUND].max_concurrency is None
    assert base == SchedulerSettings()
    assert base.lanes[Lane.VOICE] == DEFAULT_LANE_LIMITS[Lane.VOICE]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_sequencs": "4"}, "unknown scheduler setting 'max_sequencs'"),
        ({"voice.ttft": "1"}, "unknown lane limit 'ttft'"),
        ({"radio.ttft_slo_s": "1"}, "unknown lane 'radio'"),
        ({"preemption": "maybe"}, "expected a boolean, got 'maybe'"),
        ({"max_sequences": "four"}, "invalid literal"),
        ({"policy": "random"}, "'random' is not a valid Policy"),
    ],
)
def test_with_values_rejects_bad_input(values: dict[str, str], message: str) -> None:
    """A bad override names what is wrong and changes nothing."""
    with pytest.raises(ValueError, match=message):
        SchedulerSettings().with_values(values)


def test_quota_for_prefers_the_requester_override() -> None:
    """A per-requester quota wins over the default one."""
    settings = SchedulerSettings(
        quota_tokens_per_day=1000, requester_quotas={"user:a": 50}
    )
    assert settings.quota_for("user:a") == 50
    assert settings.quota_for("user:b") == 1000
