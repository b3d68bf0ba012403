"""Rolling 24-hour token budgets per requester.

Tokens are kept in five-minute buckets, so "the last 24 hours" is exact to within one bucket and a
requester costs at most 288 small entries however much they use.
"""

from __future__ import annotations

from collections import deque

DAY_S = 24 * 3600.0
"""Length of the rolling quota period."""
BUCKET_S = 300.0
"""Granularity of the rolling period."""


class QuotaLedger:
    """Tokens used by each requester over the last 24 hours."""

    __slots__ = ("_buckets", "_sums")

    def __init__(self) -> None:
        """Start with no usage."""
        self._buckets: dict[str, deque[list[float]]] = {}
        self._sums: dict[str, float] = {}

    def charge(self, requester: str, tokens: int, now: float) -> None:
        """Add tokens used by a requester at ``now``."""
        if tokens <= 0:
            return
        buckets = self._buckets.get(requester)
        if buckets is None:
            buckets = self._buckets[requester] = deque()
            self._sums[requester] = 0.0
        start = now - now % BUCKET_S
        if buckets and buckets[-1][0] == start:
            buckets[-1][1] += tokens
        else:
            buckets.append([start, float(tokens)])
        self._sums[requester] += tokens
        self._evict(requester, now)

    def used(self, requester: str, now: float) -> int:
        """Tokens the requester used in the 24 hours before ``now``."""
        if requester not in self._buckets:
            return 0
        self._evict(requester, now)
        return round(self._sums.get(requester, 0.0))

    def requesters(self) -> tuple[str, ...]:
        """Every requester with usage on record."""
        return tuple(self._buckets)

    def _evict(self, requester: str, now: float) -> None:
        buckets = self._buckets[requester]
        horizon = now - DAY_S
        while buckets and buckets[0][0] + BUCKET_S <= horizon:
            self._sums[requester] -= buckets.popleft()[1]
        if not buckets:
            del self._buckets[requester]
            del self._sums[requester]
