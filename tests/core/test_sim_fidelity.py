"""The simulator against the real server: the two evenings measured on an H200, replayed.

On ``gpu-fa-off`` (the H200 fit, flash attention off as it was measured) under ``direct`` the
simulator lands within ``TOLERANCE`` of the measured voice TTFT p50 and p95 and the background
requests finished (``tools/simulator/fidelity.py``, on virtual time: the same every run). The
figures it does not reach yet are marked, with the reason (strict: a fix shows).
"""

from __future__ import annotations

from functools import cache

import pytest

from custom_components.llm_lanes.core.bench.runner import BenchPolicy
from tools.simulator.costs import COSTS
from tools.simulator.fidelity import (
    EVENINGS,
    TOLERANCE,
    Replay,
    measured,
    replay,
    within,
)

P50_MISSES = (
    "voice's p50 sits on a knife edge: a voice command either launches on its own kept slot "
    "(~60 ms) or waits behind a host-cache copy (~300-500 ms); in the measured run fewer than "
    "half waited although the loop was blocked ~42% of the window, and the server's log has no "
    "arrival times to show why voice dodged the copies; the simulator puts just over half "
    "behind them"
)


@cache
def _replay(evening: str, policy: BenchPolicy) -> Replay:
    return replay(evening, policy, COSTS["gpu-fa-off"])


def _case(evening: str, figure: str, reason: str | None = None) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(evening, figure, marks=marks, id=f"{evening}-{figure}")


@pytest.mark.parametrize(
    ("evening", "figure"),
    [
        _case("assist_loaded", "voice_ttft_p50_s", P50_MISSES),
        _case(
            "assist_loaded",
            "voice_ttft_p95_s",
            "the 3rd-slowest of 46 commands: it waits behind a save and a load, 36% above",
        ),
        _case("assist_loaded", "background_finished"),
        _case("voice_loaded", "voice_ttft_p50_s", P50_MISSES),
        _case("voice_loaded", "voice_ttft_p95_s"),
        _case("voice_loaded", "background_finished"),
    ],
)
def test_direct_lands_within_the_tolerance_of_the_measured_run(
    evening: str, figure: str
) -> None:
    """The bare server (no scheduler) as measured: within ±30 % of each figure."""
    simulated = getattr(_replay(evening, "direct").figures, figure)
    real = getattr(measured(evening, "direct"), figure)
    assert within(simulated, real), (simulated, real, TOLERANCE)


@pytest.mark.parametrize("evening", sorted(EVENINGS))
def test_todays_lanes_on_the_measured_build(evening: str) -> None:
    """The example to turn around, where it stands: voice turned, the copies not yet.

    The measured run's ``lanes`` made voice's median 5.7x the bare server's, its loop blocked
    74 % of the window by the host cache's copies. Today's ``lanes`` on the same build (the
    simulator's ``gpu-fa-off``) gives voice a lower median and p95 than ``direct``; the copies
    still block the loop about half the window, as under ``direct`` (README *Server advice*:
    ``--cache-ram 0`` on such a build).
    """
    lanes, direct = _replay(evening, "lanes"), _replay(evening, "direct")
    assert lanes.figures.voice_ttft_p50_s < direct.figures.voice_ttft_p50_s
    assert lanes.figures.voice_ttft_p95_s < direct.figures.voice_ttft_p95_s
    assert lanes.work.blocked_share > 0.4
    assert lanes.work.saves > 0
    assert lanes.work.host_cache_s > 0.8 * (
        lanes.work.blocked_s - 0.01 * lanes.work.launches
    )


def test_the_measured_figures_are_read_from_the_reports() -> None:
    """The reports of the run give the figures the test compares with."""
    assist = measured("assist_loaded", "direct")
    assert assist.voice_ttft_p50_s == pytest.approx(0.074)
    assert assist.voice_ttft_p95_s == pytest.approx(1.11)
    assert assist.background_finished == 35
    assert measured("voice_loaded", "lanes").background_finished == 1
