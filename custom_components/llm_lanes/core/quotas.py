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
    """Tokens used by each requester over the last 24 hours, and those reserved for requests in flight.

    A request admitted reserves what it may use (its prompt and its output limit) until it ends;
    then the reservation is replaced by what it did use. Admission compares used plus reserved
    with the quota, so a burst cannot pass it by more than the one request that crosses it.
    """

    __slots__ = ("_buckets", "_reserved", "_sums")

    def __init__(self) -> None:
        """Start with no usage."""
        self._buckets: dict[str, deque[list[float]]] = {}
        self._sums: dict[str, float] = {}
        self._reserved: dict[str, int] = {}

    def reserve(self, requester: str, tokens: int) -> None:
        """Hold ``tokens`` of a requester's quota for a request in flight."""
        if tokens > 0:
            self._reserved[requester] = self._reserved.get(requester, 0) + tokens

    def release(self, requester: str, tokens: int) -> None:
        """Give back a reservation (the request ended; what it used is charged apart)."""
        left = self._reserved.get(requester, 0) - tokens
        if left > 0:
            self._reserved[requester] = left
        else:
            self._reserved.pop(requester, None)

    def reserved(self, requester: str) -> int:
        """Tokens held by the requester's requests in flight."""
        return self._reserved.get(requester, 0)

    def committed(self, requester: str, now: float) -> int:
        """Tokens used in the last 24 hours plus those reserved by requests in flight."""
        return self.used(requester, now) + self._reserved.get(requester, 0)

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

    def _evict(self, requester: str, now: float) -> None:
        buckets = self._buckets[requester]
        horizon = now - DAY_S
        while buckets and buckets[0][0] + BUCKET_S <= horizon:
            self._sums[requester] -= buckets.popleft()[1]
        if not buckets:
            del self._buckets[requester]
            del self._sums[requester]
