"""The learned batch-cost curve and the background limit it gives beside voice."""

from __future__ import annotations

from collections.abc import Callable
import random

import pytest

from custom_components.llm_lanes.core.batch_cost import (
    MIN_SAMPLES,
    REFRESH_S,
    BackgroundLimiter,
    BatchCostModel,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings

SETTINGS = SchedulerSettings(max_sequences=4)


def cpu(n: int) -> float:
    """Return the gap of a CPU server: 1.3 ms alone, each more sequence 1.1 ms (2 cost 1.85x 1)."""
    return 0.0002 + 0.0011 * n


def cpu_bound(n: int) -> float:
    """Return the gap of a server on which a second sequence costs 2.5x one."""
    return -0.002 + 0.006 * n


def gpu(n: int) -> float:
    """Return the gap of a GPU server: 8 ms plus 1.5 ms a sequence (the simulator's costs)."""
    return 0.008 + 0.0015 * n


def learned(curve: dict[int, float], sizes: range = range(1, 5)) -> BatchCostModel:
    """Return a model that has seen enough gaps of ``curve`` at every size."""
    model = BatchCostModel(8)
    for n in sizes:
        for _ in range(MIN_SAMPLES):
            model.observe(n, curve[n])
    return model


def _update(
    limiter: BackgroundLimiter,
    running: int = 3,
    now: float = 1.0,
    *,
    settings: SchedulerSettings = SETTINGS,
    voice: bool = True,
) -> int | None:
    """Ask the limiter with one voice stream active (or none), ``running`` background streams."""
    return limiter.update(
        settings,
        foreground_running=int(voice),
        foreground_waiting=0,
        others_running=0,
        background_running=running,
        foreground_lanes=(Lane.VOICE,) if voice else (),
        now=now,
    )


def test_model_learns_medians_and_predicts_the_rest() -> None:
    """Medians where measured, a line elsewhere, never falling; nothing before enough samples."""
    model = BatchCostModel(8)
    for _ in range(MIN_SAMPLES - 1):
        model.observe(1, 0.010)
    assert model.itl(1, 0.0) is None
    model.observe(1, 0.010)
    for gap in (
        0.020,
        0.021,
        0.019,
        0.5,
        0.020,
        0.020,
        0.020,
        0.020,
    ):  # one prefill outlier
        model.observe(2, gap)
    now = REFRESH_S * 2
    assert model.itl(1, now) == pytest.approx(0.010)
    assert model.itl(2, now) == pytest.approx(0.020)
    assert model.itl(4, now) == pytest.approx(0.040)  # the line through both
    assert model.itl(20, now) == model.itl(
        8, now
    )  # sizes beyond the last count as the last
    points = model.points(now)
    assert [(p.sequences, p.samples) for p in points] == [(1, 8), (2, 8)]


def test_curve_never_falls_with_more_sequences() -> None:
    """A noisy point below a smaller batch's is raised to it."""
    model = learned({1: 0.010, 2: 0.030, 3: 0.025, 4: 0.040})
    curve = [model.itl(n, 1.0) for n in range(1, 5)]
    assert curve == sorted(curve)
    assert curve[2] == pytest.approx(0.030)


@pytest.mark.parametrize(
    ("curve", "expected"),
    [
        # CPU: two sequences cost 1.85x one, within voice's 2x: one background stream stays.
        (cpu, 1),
        # Worse still: a second sequence costs 2.5x: background makes way entirely.
        (cpu_bound, 0),
        # GPU: four sequences cost 1.47x one: every background stream may stay.
        (gpu, 3),
    ],
)
def test_limit_keeps_voice_within_its_slowdown(
    curve: Callable[[int], float], expected: int
) -> None:
    """Beside one voice stream, background keeps what holds voice within its objective of 2x."""
    model = learned({n: curve(n) for n in range(1, 5)})
    assert _update(BackgroundLimiter(model)) == expected


def test_no_limit_without_foreground_or_before_anything_is_learned() -> None:
    """Background is limited only while voice or interactive work is active, and known."""
    limiter = BackgroundLimiter(learned({n: cpu(n) for n in range(1, 5)}))
    assert _update(limiter, voice=False) is None
    assert _update(BackgroundLimiter(BatchCostModel(8))) is None


def test_the_lane_objective_bounds_the_limit_too() -> None:
    """However small the slowdown, background never pushes voice past its ITL objective."""
    slow = {
        n: 0.060 + 0.015 * n for n in range(1, 5)
    }  # alone 75 ms; voice objective 100 ms
    settings = SchedulerSettings(max_sequences=4).with_lane(
        Lane.VOICE, itl_slowdown_slo=3.0
    )
    assert (
        _update(BackgroundLimiter(learned(slow)), 0, settings=settings) == 1
    )  # 2 sequences: 90 ms; 3: 105 ms > 100 ms


def test_hysteresis_keeps_running_streams_and_raises_only_clearly() -> None:
    """Between the bound and 110 % of it the limit neither rises nor falls."""
    # Alone 10 ms, bound 20 ms (twice); two sequences 21 ms: inside the band.
    model = learned({1: 0.010, 2: 0.021, 3: 0.030, 4: 0.040})
    limiter = BackgroundLimiter(model)
    assert _update(limiter, 1, 1.0) == 1  # the running stream stays (21 <= 22)
    _update(limiter, 0, 2.0, voice=False)
    # Voice again with no background running: 21 ms is over 20, so none is let in.
    assert _update(limiter, 0, 3.0) == 0
    assert _update(limiter, 0, 4.0) == 0


def test_one_size_seen_predicts_the_others_cautiously() -> None:
    """Background alone at full batch teaches one size: smaller ones are guessed proportional."""
    model = learned({4: 0.014}, sizes=range(4, 5))
    assert model.itl(1, 1.0) == pytest.approx(0.0035)
    assert model.itl(2, 1.0) == pytest.approx(0.007)
    # Beside voice that allows one stream (2x), until a second size is seen.
    assert _update(BackgroundLimiter(model)) == 1


def test_limit_converges_from_a_cold_start() -> None:
    """Learning from noisy gaps of a CPU-like server, the limit settles at 1 and stays there."""
    rng = random.Random(7)
    model = BatchCostModel(8)
    limiter = BackgroundLimiter(model)
    limits: list[int | None] = []
    now = 0.0
    for step in range(400):
        now += 0.05
        background = 3 if step % 40 < 30 else 2
        voice = 1 if step % 40 >= 30 else 0
        n = background + voice
        model.observe(n, cpu(n) * rng.uniform(0.9, 1.1))
        if voice:
            model.observe(1, cpu(1) * rng.uniform(0.9, 1.1))
            limits.append(_update(limiter, background, now))
    settled = limits[len(limits) // 2 :]
    assert settled and all(limit == 1 for limit in settled)
