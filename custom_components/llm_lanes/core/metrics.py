"""Sliding-window measurements: latency percentiles, token rates and goodput.

Samples are appended in time order, so each window is a deque trimmed from the left; percentiles are
computed only when a snapshot is taken (at most once a second), never per token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
import math

DEFAULT_MAX_SAMPLES = 10_000
"""Cap on the samples one window keeps (the newest win), so memory and the cost of a snapshot
(one sort per window) stay bounded under load."""


def percentile(ordered: list[float], fraction: float) -> float:
    """Percentile of already sorted values, by linear interpolation between closest ranks."""
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50/p90/p95/p99 of one window (all None when it holds no sample)."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        """Compute the four percentiles of some values."""
        if not values:
            return cls()
        ordered = sorted(values)
        return cls(
            percentile(ordered, 0.5),
            percentile(ordered, 0.9),
            percentile(ordered, 0.95),
            percentile(ordered, 0.99),
        )


class SampleWindow:
    """Timestamped samples of one quantity over the last ``window_s`` seconds."""

    __slots__ = ("_samples",)

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        """Start empty."""
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, now: float, value: float) -> None:
        """Record one sample taken at ``now``."""
        self._samples.append((now, value))

    def values(self, now: float, window_s: float) -> list[float]:
        """Return the samples of the last ``window_s`` seconds (dropping older ones)."""
        samples = self._samples
        horizon = now - window_s
        while samples and samples[0][0] < horizon:
            samples.popleft()
        return [value for _, value in samples]


class RateWindow:
    """Amounts added over a sliding window, kept in coarse buckets (cheap per token)."""

    __slots__ = ("_bucket_s", "_buckets", "_total")

    BUCKETS = 30

    def __init__(self) -> None:
        """Start empty."""
        self._buckets: deque[list[float]] = deque()
        self._total = 0.0
        self._bucket_s = 0.0

    def add(self, now: float, amount: float, window_s: float) -> None:
        """Add an amount at ``now``."""
        buckets = self._buckets
        if buckets and now < buckets[-1][0] + window_s / self.BUCKETS:
            buckets[-1][1] += amount
        else:
            buckets.append([now, amount])
        self._total += amount

    def total(self, now: float, window_s: float) -> float:
        """Sum of the amounts added in the last ``window_s`` seconds (to within one bucket)."""
        buckets = self._buckets
        horizon = now - window_s
        while buckets and buckets[0][0] < horizon:
            self._total -= buckets.popleft()[1]
        if not buckets:
            self._total = 0.0
        return self._total


@dataclass(frozen=True, slots=True)
class StatsView:
    """What one group of requests (a lane or a requester) looked like over the window."""

    finished_in_window: int
    good_in_window: int
    queue_wait: Percentiles
    ttft: Percentiles
    itl: Percentiles
    e2e: Percentiles
    goodput: float | None
    good_per_s: float
    prompt_tok_s: float
    output_tok_s: float


class GroupStats:
    """Sliding-window statistics and running totals of one lane or one requester."""

    __slots__ = (
        "_finished",
        "e2e",
        "finished_total",
        "itl",
        "output_rate",
        "output_tokens_total",
        "preemptions_total",
        "prompt_rate",
        "prompt_tokens_total",
        "queue_wait",
        "rejected_total",
        "ttft",
    )

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        """Start with nothing measured; each window keeps at most ``max_samples`` samples."""
        self.queue_wait = SampleWindow(max_samples)
        self.ttft = SampleWindow(max_samples)
        self.itl = SampleWindow(max_samples)
        self.e2e = SampleWindow(max_samples)
        self.output_rate = RateWindow()
        self.prompt_rate = RateWindow()
        self._finished: deque[tuple[float, bool]] = deque(maxlen=max_samples)
        self.finished_total = 0
        self.rejected_total = 0
        self.preemptions_total = 0
        self.prompt_tokens_total = 0
        self.output_tokens_total = 0

    def record_finished(
        self,
        now: float,
        *,
        counts_for_goodput: bool,
        good: bool,
        queue_wait_s: float | None,
        ttft_s: float | None,
        e2e_s: float,
        prompt_tokens: int,
        output_tokens: int,
    ) -> None:
        """Record one request that left the scheduler after being queued."""
        self.finished_total += 1
        self.prompt_tokens_total += prompt_tokens
        self.output_tokens_total += output_tokens
        if queue_wait_s is not None:
            self.queue_wait.add(now, queue_wait_s)
        if ttft_s is not None:
            self.ttft.add(now, ttft_s)
        self.e2e.add(now, e2e_s)
        if counts_for_goodput:
            self._finished.append((now, good))

    def view(self, now: float, window_s: float) -> StatsView:
        """Percentiles, goodput and rates over the last ``window_s`` seconds."""
        finished = self._finished
        horizon = now - window_s
        while finished and finished[0][0] < horizon:
            finished.popleft()
        good = sum(1 for _, ok in finished if ok)
        return StatsView(
            finished_in_window=len(finished),
            good_in_window=good,
            queue_wait=Percentiles.of(self.queue_wait.values(now, window_s)),
            ttft=Percentiles.of(self.ttft.values(now, window_s)),
            itl=Percentiles.of(self.itl.values(now, window_s)),
            e2e=Percentiles.of(self.e2e.values(now, window_s)),
            goodput=good / len(finished) if finished else None,
            good_per_s=good / window_s if window_s > 0 else 0.0,
            prompt_tok_s=self.prompt_rate.total(now, window_s) / window_s
            if window_s > 0
            else 0.0,
            output_tok_s=self.output_rate.total(now, window_s) / window_s
            if window_s > 0
            else 0.0,
        )


def request_itl_p95(gaps: list[float]) -> float | None:
    """p95 of one request's inter-token gaps (None with fewer than two tokens)."""
    if not gaps:
        return None
    return percentile(sorted(gaps), 0.95)
