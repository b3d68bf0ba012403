"""Rolling 24 h token budgets."""

from __future__ import annotations

from custom_components.llm_lanes.core.quotas import BUCKET_S, DAY_S, QuotaLedger


def test_usage_rolls_off_after_a_day() -> None:
    """Tokens count for 24 hours (to within one bucket), then drop off."""
    ledger = QuotaLedger()
    ledger.charge("kid", 100, 0.0)
    ledger.charge("kid", 50, 3600.0)
    ledger.charge("adult", 7, 3600.0)
    assert ledger.used("kid", 7200.0) == 150
    assert ledger.used("kid", DAY_S + BUCKET_S + 1) == 50
    assert ledger.used("kid", 2 * DAY_S + BUCKET_S) == 0
    assert ledger.used("nobody", 0.0) == 0
    # A requester whose usage rolled off leaves nothing behind (the ledger stays bounded).
    assert set(ledger._buckets) == {"adult"}
