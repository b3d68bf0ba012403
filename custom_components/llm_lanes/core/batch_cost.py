"""How much each extra running sequence slows every stream, learned per server, and what follows.

A server decodes one token for every running sequence per iteration, so a stream's inter-token
gap is the iteration time at the current batch size. On a GPU an extra sequence costs little (the
weights are read once per iteration for all of them); on a CPU every sequence costs nearly a whole
extra pass, and a voice answer that shares the batch with three summaries streams at a third of
its speed. ``BatchCostModel`` learns that curve from the gaps the scheduler sees anyway (one
sample per streamed token, tagged with the sequences decoding, taken only while the server
prefills no prompt beside them: a prefill stretches every gap of its iteration), and ``BackgroundLimiter`` turns it
into the number of background streams that may keep running while voice or interactive requests
are queued or streaming: as many as keep those streams' predicted gap within their lanes'
objectives — the inter-token objective (``itl_slo_s``) and, against the gap of one stream alone on
the server, the slowdown objective (``itl_slowdown_slo``, twice the gap for voice and
typed chats). On a GPU that is all of them; on a CPU where two sequences cost 1.85x one, one
stream beside voice; for the seconds a voice answer lasts.

The estimate of a batch size is the median of its recent gaps (robust to the odd gap stretched by
a prefill); batch sizes not seen yet are predicted by a least-squares line through the medians
that were, and the curve is kept non-decreasing. While a single batch size is known (background
alone at full batch, say), the others are predicted as if every sequence cost a whole pass (a
CPU's case, the cautious one) until a second size is seen. With hysteresis a running stream is
kept while the prediction stays within ``KEEP_MARGIN`` of the bound, and a new one admitted only
within the bound, so noise does not preempt and restart streams in turns.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
import statistics

from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings

SAMPLES_PER_BATCH_SIZE = 64
"""Recent gaps kept per batch size."""
MIN_SAMPLES = 8
"""Gaps a batch size needs before its median counts."""
KEEP_MARGIN = 1.1
"""Streams already running beside the foreground are kept while the prediction stays within this
multiple of the bound (new ones need the bound itself)."""
REFRESH_S = 0.5
"""The curve's medians are recomputed at most this often."""


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """The learned inter-token gap at one batch size."""

    sequences: int
    itl_s: float
    samples: int
    """Gaps measured at this size (0: predicted from the others)."""


class BatchCostModel:
    """Inter-token gap against sequences in flight, learned from the streams' own gaps."""

    __slots__ = ("_at", "_curve", "_gaps", "_max_sequences")

    def __init__(self, max_sequences: int = 64) -> None:
        """Learn sizes 1 to ``max_sequences`` (larger ones count as the largest)."""
        self._max_sequences = max(1, max_sequences)
        self._gaps: list[deque[float]] = [
            deque(maxlen=SAMPLES_PER_BATCH_SIZE) for _ in range(self._max_sequences)
        ]
        self._curve: list[float | None] | None = None
        self._at = float("-inf")

    def observe(self, sequences: int, gap_s: float) -> None:
        """Record one gap seen while ``sequences`` sequences were in flight (hot path)."""
        if sequences >= 1:
            self._gaps[min(sequences, self._max_sequences) - 1].append(gap_s)

    def seed(self, sequences: int, itl_s: float) -> None:
        """Start a batch size from a measurement (a calibration) instead of from nothing."""
        if sequences >= 1:
            gaps = self._gaps[min(sequences, self._max_sequences) - 1]
            gaps.extend([itl_s] * max(0, MIN_SAMPLES - len(gaps)))
            self._curve = None

    def forget(self) -> None:
        """Forget everything learned (the server now runs another model or context)."""
        for gaps in self._gaps:
            gaps.clear()
        self._curve = None

    def itl(self, sequences: int, now: float) -> float | None:
        """Predicted gap with ``sequences`` in flight; None until anything was learned."""
        if sequences < 1:
            return None
        curve = self._refresh(now)
        return curve[min(sequences, self._max_sequences) - 1]

    def points(self, now: float) -> list[CurvePoint]:
        """Return the curve up to the largest size measured (for diagnostics and the benchmark)."""
        curve = self._refresh(now)
        measured = [i for i, gaps in enumerate(self._gaps) if len(gaps) >= MIN_SAMPLES]
        if not measured:
            return []
        return [
            CurvePoint(
                sequences=i + 1,
                itl_s=value,
                samples=len(self._gaps[i]) if i in measured else 0,
            )
            for i in range(max(measured) + 1)
            if (value := curve[i]) is not None
        ]

    def _refresh(self, now: float) -> list[float | None]:
        if self._curve is not None and now - self._at < REFRESH_S:
            return self._curve
        self._at = now
        medians = {
            i + 1: statistics.median(gaps)
            for i, gaps in enumerate(self._gaps)
            if len(gaps) >= MIN_SAMPLES
        }
        self._curve = _fill(medians, self._max_sequences)
        return self._curve


def _fill(medians: dict[int, float], size: int) -> list[float | None]:
    """Medians where measured, a fitted line elsewhere, non-decreasing in the batch size."""
    if not medians:
        return [None] * size
    if len(medians) == 1:
        # One size seen: every sequence a whole pass, the cautious guess.
        ((measured, gap),) = medians.items()
        return [medians.get(n, gap * n / measured) for n in range(1, size + 1)]
    intercept, slope = _line(medians)
    curve: list[float | None] = []
    floor = 0.0
    for n in range(1, size + 1):
        value = medians.get(n)
        if value is None:
            value = intercept + slope * n
        floor = max(floor, value)
        curve.append(floor)
    return curve


def _line(medians: dict[int, float]) -> tuple[float, float]:
    """Least-squares line through two or more medians (never falling)."""
    xs = list(medians)
    ys = list(medians.values())
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    slope = max(0.0, slope)
    return mean_y - slope * mean_x, slope


class BackgroundLimiter:
    """The background streams that may run beside active voice or interactive work.

    ``update`` is called whenever the scheduler decides; it returns None while no foreground
    request is queued, streaming or expected, or while nothing has been learned yet, else the most
    background streams that keep the foreground within its bound now. The policy applies it
    (unless ``background_with_voice`` fixes the number).
    """

    __slots__ = ("_limit", "model")

    def __init__(self, model: BatchCostModel) -> None:
        """Decide from ``model``'s curve."""
        self.model = model
        self._limit: int | None = None

    @property
    def limit(self) -> int | None:
        """The limit decided last."""
        return self._limit

    def update(
        self,
        settings: SchedulerSettings,
        *,
        foreground_running: int,
        foreground_waiting: int,
        others_running: int,
        background_running: int,
        foreground_lanes: tuple[Lane, ...],
        now: float,
    ) -> int | None:
        """Decide the limit for the foreground activity described (see the class docstring)."""
        if not foreground_lanes:
            self._limit = None
            return None
        base = max(1, foreground_running + foreground_waiting) + others_running
        # A stream's speed alone on the server: what the slowdown objective is measured against
        # (the foreground's own streams slow each other too, and that counts against it).
        alone = self.model.itl(1, now)
        if alone is None:
            # Nothing learned yet: let background run rather than guess.
            self._limit = None
            return None
        bound = min(
            min(
                limits.itl_slo_s,
                alone * limits.itl_slowdown_slo
                if limits.itl_slowdown_slo is not None
                else limits.itl_slo_s,
            )
            for limits in (settings.lanes[lane] for lane in foreground_lanes)
        )
        current = background_running if self._limit is None else self._limit
        allowed = 0
        for extra in range(1, max(settings.max_sequences - base, 0) + 1):
            predicted = self.model.itl(base + extra, now)
            if predicted is None:
                break
            if predicted > (bound * KEEP_MARGIN if extra <= current else bound):
                break
            allowed = extra
        self._limit = allowed
        return allowed
