"""The frontier of voice TTFT p95 against background tokens/s over the scheduler's knobs.

``scripts/bench frontier --server engine:costs=gpu --scenario assist_evening ...`` runs the
defaults and every combination of a grid of knobs (the sweep's ``--grid``, or ``DEFAULT_GRID``),
marks the runs no other beats on both axes (a lower voice p95 *and* more background tokens/s),
and says where the defaults sit: on the frontier, or how much a knob setting gains on one axis
without losing on the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
import secrets
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.runner import Progress
from custom_components.llm_lanes.core.bench.servers import ServerDescription
from custom_components.llm_lanes.core.bench.sweep import combinations
from custom_components.llm_lanes.core.bench.workload import Scenario
from custom_components.llm_lanes.core.settings import SchedulerSettings
from tools.bench.ablation import LaneFigures, run_seeds

DEFAULT_GRID: dict[str, list[str]] = {
    "headroom": ["0", "1", "2"],
    "prefill_step_s": ["0", "0.025", "0.1"],
    "prefill_guard_tokens": ["256", "1000000"],
    "background_share": ["0.1", "0.3"],
}
"""The knobs that trade voice's tail against background's tokens, at values apart enough to show."""
NEAR = 0.10
"""Defaults within this share of the frontier on both axes count as on it."""


@dataclass(slots=True)
class FrontierPoint:
    """One setting of the knobs and what voice and background got with it."""

    overrides: dict[str, str]
    figures: LaneFigures
    defaults: bool = False
    frontier: bool = False

    @property
    def label(self) -> str:
        """The knob values, or ``defaults``."""
        if self.defaults:
            return "defaults"
        return " ".join(f"{k}={v}" for k, v in self.overrides.items()) or "defaults"

    @property
    def voice_p95(self) -> float:
        """Voice TTFT p95 (infinite where voice finished nothing)."""
        value = self.figures.voice_ttft_p95
        return float("inf") if value is None else value

    @property
    def background(self) -> float:
        """Background tokens/s."""
        return self.figures.background_tok_s

    def beats(self, other: FrontierPoint) -> bool:
        """No worse on either axis and better on one."""
        return (
            self.voice_p95 <= other.voice_p95
            and self.background >= other.background
            and (self.voice_p95 < other.voice_p95 or self.background > other.background)
        )


@dataclass(frozen=True, slots=True)
class Position:
    """Where the defaults sit: the most a setting gains on one axis without losing on the other."""

    voice_gain: float
    """Defaults' voice p95 over the lowest p95 of a setting with at least their background."""
    background_gain: float
    """The most background tokens/s of a setting with at most their voice p95, over theirs."""
    best_voice: FrontierPoint
    best_background: FrontierPoint

    @property
    def near(self) -> bool:
        """Within NEAR of the frontier on both axes."""
        return self.voice_gain <= 1 + NEAR and self.background_gain <= 1 + NEAR


def mark_frontier(points: Sequence[FrontierPoint]) -> None:
    """Flag the points that no other beats."""
    for point in points:
        point.frontier = not any(other.beats(point) for other in points)


def position(points: Sequence[FrontierPoint]) -> Position:
    """Where the defaults sit among ``points`` (one of which is the defaults)."""
    defaults = next(p for p in points if p.defaults)
    richer = [p for p in points if p.background >= defaults.background]
    faster = [p for p in points if p.voice_p95 <= defaults.voice_p95]
    best_voice = min(richer, key=lambda p: (p.voice_p95, -p.background))
    best_background = max(faster, key=lambda p: (p.background, -p.voice_p95))
    return Position(
        voice_gain=defaults.voice_p95 / best_voice.voice_p95
        if best_voice.voice_p95
        else 1.0,
        background_gain=best_background.background / defaults.background
        if defaults.background
        else 1.0,
        best_voice=best_voice,
        best_background=best_background,
    )


async def map_frontier(
    backend: Backend,
    scenario: Scenario,
    *,
    server: ServerDescription,
    base_settings: SchedulerSettings,
    grid: dict[str, list[str]],
    seeds: int = 1,
    time_scale: float = 1.0,
    prompt_scale: float = 1.0,
    progress_for: Callable[[str], Progress | None] | None = None,
    on_point: Callable[[FrontierPoint], None] | None = None,
    between: Callable[[], Awaitable[None]] | None = None,
) -> list[FrontierPoint]:
    """Run the defaults and every combination of ``grid``; return the points, frontier marked."""
    salt = secrets.token_hex(4)
    settings_run: list[tuple[dict[str, str], bool]] = [({}, True)]
    settings_run += [(overrides, False) for overrides in combinations(grid)]
    points: list[FrontierPoint] = []
    for overrides, defaults in settings_run:
        if between is not None:
            await between()
        label = (
            "defaults"
            if defaults
            else " ".join(f"{k}={v}" for k, v in overrides.items())
        )
        figures = await run_seeds(
            backend,
            scenario,
            policy="lanes",
            settings=base_settings.with_values(overrides),
            server=server,
            seeds=seeds,
            salt=f"{salt}:{label}",
            time_scale=time_scale,
            prompt_scale=prompt_scale,
            progress=progress_for(label) if progress_for is not None else None,
        )
        point = FrontierPoint(overrides, figures, defaults)
        points.append(point)
        if on_point is not None:
            on_point(point)
    mark_frontier(points)
    return points


def frontier_markdown(points: Sequence[FrontierPoint], title: str) -> str:
    """Render the points (frontier first, by voice p95) and the defaults' place as Markdown."""
    where = position(points)
    lines = [
        f"### {title}",
        "",
        "| setting | voice TTFT p95 ms | background tok/s | frontier |",
        "|---|---|---|---|",
    ]
    for point in sorted(points, key=lambda p: (not p.frontier, p.voice_p95)):
        p95 = (
            "–" if point.voice_p95 == float("inf") else f"{point.voice_p95 * 1000:.0f}"
        )
        lines.append(
            f"| {point.label} | {p95} | {point.background:.1f} | "
            f"{'yes' if point.frontier else ''} |"
        )
    verdict = (
        "on the frontier"
        if next(p for p in points if p.defaults).frontier
        else ("within 10 % of the frontier" if where.near else "off the frontier")
    )
    lines += [
        "",
        (
            f"Defaults: {verdict}; a setting with at least their background tokens/s gives voice "
            f"{where.voice_gain:.2f}x lower p95 ({where.best_voice.label}); one with at most their "
            f"voice p95 gives background {where.background_gain:.2f}x "
            f"({where.best_background.label})."
        ),
    ]
    return "\n".join(lines) + "\n"


def frontier_dict(scenario: str, points: Sequence[FrontierPoint]) -> dict[str, Any]:
    """Return the points of one scenario and the defaults' place as plain JSON."""
    where = position(points)
    return {
        "scenario": scenario,
        "points": [
            {
                "label": p.label,
                "settings": p.overrides,
                "frontier": p.frontier,
                "defaults": p.defaults,
                **asdict(p.figures),
            }
            for p in points
        ],
        "defaults": {
            "frontier": next(p for p in points if p.defaults).frontier,
            "near": where.near,
            "voice_gain": where.voice_gain,
            "background_gain": where.background_gain,
        },
    }
