"""A short calibration on the user's own server: the engine of ``llm_lanes.run_benchmark``.

It first measures the server's batch curve (``curve.py``: inter-token latency and tokens/s
against sequences in flight, and the prefill speed), then replays a built-in scenario, shortened
to ``duration_s`` per combination, over a small grid of settings under the ``lanes`` policy, and
recommends the setting with the highest goodput. The curve adds what it decides: the prefill
guard (the prompt the server prefills within voice's inter-token objective) and headroom (one
slot kept for voice and typed chats whenever there are two or more).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.curve import (
    BatchCurve,
    measure_curve,
    text_plot,
)
from custom_components.llm_lanes.core.bench.runner import BenchPolicy, describe_server
from custom_components.llm_lanes.core.bench.sweep import run_sweep
from custom_components.llm_lanes.core.bench.workload import Scenario, load_scenario
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings

DEFAULT_SCENARIO = "evening"
DEFAULT_GRID: Mapping[str, Sequence[str]] = {
    "max_sequences": ("1", "2", "4", "8"),
    "prefill_budget": ("1024", "4096"),
}


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    """The frontier table and what to apply."""

    rows: list[dict[str, Any]]
    """One per combination: label, settings, goodput, good_per_s, output_tok_s, frontier, classes."""
    recommended: SchedulerSettings
    recommended_values: dict[str, str]
    best_throughput_values: dict[str, str]
    explanation: str
    curve: BatchCurve | None = None
    """The server's batch curve, measured first."""

    def as_response(self) -> dict[str, Any]:
        """Plain JSON for the action's response data."""
        return {
            "curve": self.curve.as_dict() if self.curve is not None else None,
            "curve_plot": text_plot(self.curve) if self.curve is not None else None,
            "rows": self.rows,
            "recommended": self.recommended_values,
            "best_throughput": self.best_throughput_values,
            "explanation": self.explanation,
        }


def shorten(scenario: Scenario, duration_s: float) -> Scenario:
    """Cut the scenario to ``duration_s`` (warm-up kept to a sixth of it at most)."""
    return replace(
        scenario,
        duration_s=duration_s,
        warmup_s=min(scenario.warmup_s, duration_s / 6),
    )


async def calibrate(
    backend: Backend,
    base_settings: SchedulerSettings,
    *,
    scenario: str | Scenario = DEFAULT_SCENARIO,
    grid: Mapping[str, Sequence[str]] = DEFAULT_GRID,
    duration_s: float = 30.0,
    policy: BenchPolicy = "lanes",
    model: str | None = None,
    time_scale: float = 1.0,
) -> CalibrationResult:
    """Run the grid and recommend the setting with the highest goodput.

    ``max_sequences`` values above the server's slot count are dropped (the server would only
    queue them). Takes about ``duration_s`` times the number of combinations.
    """
    server = await describe_server(backend, model)
    curve = await measure_curve(
        backend,
        server.model,
        server.slots or base_settings.max_sequences,
        time_scale=time_scale,
    )
    loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    effective = {key: list(values) for key, values in grid.items()}
    if server.slots and "max_sequences" in effective:
        kept = [v for v in effective["max_sequences"] if int(v) <= server.slots]
        effective["max_sequences"] = kept or [str(server.slots)]
    result = await run_sweep(
        backend,
        shorten(loaded, duration_s),
        policies=[policy],
        base_settings=base_settings,
        grid=effective,
        server=server,
        time_scale=time_scale,
    )
    best = result.best_goodput
    values = dict(best.overrides)
    sequences = int(values.get("max_sequences", base_settings.max_sequences))
    values["headroom"] = "1" if sequences > 1 else "0"
    guard = curve.guard_tokens(base_settings.lanes[Lane.VOICE].itl_slo_s)
    if guard is not None:
        values["prefill_guard_tokens"] = str(guard)
    return CalibrationResult(
        rows=[row.as_dict() for row in result.rows],
        recommended=base_settings.with_values(values),
        recommended_values=values,
        best_throughput_values=dict(result.best_throughput.overrides),
        explanation=result.explanation,
        curve=curve,
    )
