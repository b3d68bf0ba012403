"""A short calibration on the user's own server: the engine of ``llm_lanes.run_benchmark``.

It first measures the server's batch curve (``curve.py``: inter-token latency and tokens/s
against sequences in flight, and the prefill speed), then replays a built-in scenario, shortened
to ``duration_s`` per combination, over a small grid of settings and the current ones under the
``lanes`` policy, and recommends the setting with the highest goodput. The curve adds what it
decides: the prefill guard (the prompt the server prefills within voice's inter-token objective)
and headroom (one slot kept for voice and typed chats whenever there are two or more). Every
request fits the server's slot: the scenario's prompts and answers are scaled down where they
would not (``Scenario.fitted``).

Whether the recommendation should be applied is decided on the same measurements
(``decide``): never from a run too short to tell the settings apart, and never when it is no
better than the current settings. A run that cannot be long enough is known before it starts
(``measured_requests``: the requests the scenario sends in a setting's measured window), and so
is how long it takes (``CalibrationPlan``); ``calibrate`` reports its progress as it goes.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
import math
from typing import Any, Final, Literal

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.curve import (
    BatchCurve,
    measure_curve,
    text_plot,
)
from custom_components.llm_lanes.core.bench.runner import BenchPolicy, describe_server
from custom_components.llm_lanes.core.bench.sweep import (
    SweepRow,
    combinations,
    run_sweep,
)
from custom_components.llm_lanes.core.bench.workload import (
    Scenario,
    load_scenario,
    plan_open_requests,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings

DEFAULT_SCENARIO = "evening"
DEFAULT_GRID: Mapping[str, Sequence[str]] = {
    "max_sequences": ("1", "2", "4", "8"),
    "prefill_budget": ("1024", "4096"),
}
MIN_FINISHED_PER_ROW: Final = 10
"""The requests each setting must finish before settings are told apart: with fewer, one request
more or less moves a setting's goodput by more than a tenth."""
THROUGHPUT_NOISE: Final = 0.05
"""Two settings' output tokens/s within this share of each other are alike (every setting replays
the same requests; only their timing differs)."""
MAX_DURATION_S: Final = 600
"""The longest run per setting the action takes (what a suggested duration stops at)."""


class Verdict(StrEnum):
    """Whether the recommendation may be applied, and if not, why."""

    APPLY = "apply"
    """Measurably better than the current settings."""
    TOO_SHORT = "too_short"
    """A setting finished fewer than ``MIN_FINISHED_PER_ROW`` requests."""
    ALIKE = "alike"
    """Every setting measured like the current ones: the run cannot tell them apart."""
    NOT_BETTER = "not_better"
    """The recommendation is the current settings, or no better than them."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on a recommendation and the sentence that says why."""

    verdict: Verdict
    reason: str

    @property
    def applies(self) -> bool:
        """Whether the recommendation may be applied."""
        return self.verdict is Verdict.APPLY


def goodput_noise(first: SweepRow, second: SweepRow) -> float:
    """Return what one request more or less is worth in goodput, in the smaller of two rows.

    A hair more, so that exactly one request (computed in floating point) is within it.
    """
    return (1.0 + 1e-9) / max(1, min(first.finished, second.finished))


def alike(first: SweepRow, second: SweepRow) -> bool:
    """Whether two rows differ by no more than their noise, in goodput and in tokens/s."""
    return abs(first.goodput - second.goodput) <= goodput_noise(first, second) and abs(
        first.output_tok_s - second.output_tok_s
    ) <= THROUGHPUT_NOISE * max(first.output_tok_s, second.output_tok_s)


def better(candidate: SweepRow, current: SweepRow) -> bool:
    """Whether ``candidate`` beats ``current``: more goodput than noise, else more tokens/s.

    A goodput gain of more than one request wins even at fewer tokens/s (goodput is what the
    pick is for); within that noise only more tokens/s (beyond ``THROUGHPUT_NOISE``) does.
    """
    gain = candidate.goodput - current.goodput
    noise = goodput_noise(candidate, current)
    if gain > noise:
        return True
    if gain < -noise:
        return False
    return candidate.output_tok_s > current.output_tok_s * (1 + THROUGHPUT_NOISE)


def _measured(row: SweepRow) -> str:
    return f"{row.goodput:.0%} goodput at {row.output_tok_s:.0f} tok/s"


def decide(
    rows: Sequence[SweepRow], pick: SweepRow, current: SweepRow, duration_s: float
) -> Decision:
    """Decide whether ``pick`` may replace ``current``, from the rows both were measured among.

    Not from a run too short to tell (a row with fewer than ``MIN_FINISHED_PER_ROW`` finished
    requests, or every row within its noise of the current one), and only when the pick is
    measurably better than the current settings (``better``): it is never worse.
    """
    fewest = min(rows, key=lambda row: row.finished)
    if fewest.finished < MIN_FINISHED_PER_ROW:
        longer = math.ceil(
            1.2 * duration_s * MIN_FINISHED_PER_ROW / max(1, fewest.finished)
        )
        return Decision(
            Verdict.TOO_SHORT,
            f"Too short to tell: {fewest.label} finished {fewest.finished} requests in "
            f"{duration_s:g} s, and each setting needs {MIN_FINISHED_PER_ROW} before settings "
            f"can be told apart; nothing is applied. Run it for about "
            f"{min(longer, MAX_DURATION_S)} s (duration_s).",
        )
    if all(alike(row, current) for row in rows):
        return Decision(
            Verdict.ALIKE,
            f"Every setting measured like the current ones ({_measured(current)}: goodput "
            f"within one request, tokens/s within {THROUGHPUT_NOISE:.0%}), so the run cannot "
            "tell them apart; nothing is applied. A longer run or a busier scenario can.",
        )
    if pick is current:
        return Decision(
            Verdict.NOT_BETTER,
            f"The current settings ({current.label}) measured best ({_measured(current)}); "
            "nothing to change.",
        )
    if not better(pick, current):
        return Decision(
            Verdict.NOT_BETTER,
            f"{pick.label} measured {_measured(pick)}, the current settings "
            f"({current.label}) {_measured(current)}: no better, so nothing is applied.",
        )
    return Decision(
        Verdict.APPLY,
        f"{pick.label} measured {_measured(pick)} against the current settings' "
        f"{_measured(current)} ({current.label}).",
    )


def drain_s(duration_s: float) -> float:
    """How long a setting's requests still running at its end may finish (the runner's default)."""
    return max(5.0, duration_s / 5)


def measured_requests(scenario: Scenario, duration_s: float) -> int | None:
    """Return the requests a setting of a ``duration_s`` run sends in its measured window.

    Those are the most it can finish, the number ``decide`` needs ``MIN_FINISHED_PER_ROW`` of.
    None when a class loops (``closed``): it sends as many as the server answers, unknown before.
    """
    if any(cls.arrival.process == "closed" for cls in scenario.classes):
        return None
    short = shorten(scenario, duration_s)
    return sum(
        1 for planned in plan_open_requests(short) if planned.at_s >= short.warmup_s
    )


def shortest_duration(scenario: Scenario) -> int | None:
    """Return a ``duration_s`` whose window holds ``MIN_FINISHED_PER_ROW`` requests, with room.

    A fifth more than the shortest whole number of seconds that does (not every request sent
    finishes in time), at most ``MAX_DURATION_S``; None when the scenario loops (see
    ``measured_requests``) or no duration up to ``MAX_DURATION_S`` does.
    """
    if measured_requests(scenario, 1) is None:
        return None
    # A shorter run's arrivals are the first ones of a longer run's (each class's own generator).
    times = sorted(
        planned.at_s
        for planned in plan_open_requests(shorten(scenario, MAX_DURATION_S))
    )
    for duration in range(1, MAX_DURATION_S + 1):
        warmup = shorten(scenario, duration).warmup_s
        if bisect_left(times, duration) - bisect_left(times, warmup) >= (
            MIN_FINISHED_PER_ROW
        ):
            return min(math.ceil(1.2 * duration), MAX_DURATION_S)
    return None


@dataclass(frozen=True, slots=True)
class CalibrationPlan:
    """What a calibration runs after the batch curve, known before it starts."""

    settings: int
    """Settings run (the grid's within the server's slots, and the current ones)."""
    duration_s: float
    """How long each setting sends requests."""

    @property
    def setting_s(self) -> float:
        """The longest one setting takes: its duration, then what still runs may finish."""
        return self.duration_s + drain_s(self.duration_s)

    @property
    def settings_s(self) -> float:
        """The longest the settings take together."""
        return self.settings * self.setting_s


type Step = Literal["batch_curve", "sweep", "setting", "done"]


@dataclass(frozen=True, slots=True)
class CalibrationProgress:
    """Where a calibration is: at the batch curve, at the settings, a setting done, or done."""

    step: Step
    settings_done: int
    settings_total: int
    elapsed_s: float
    remaining_s: float
    """The longest what is left may take (the batch curve while it runs not counted)."""
    setting: str | None = None
    """The setting just done (``step`` ``setting``)."""


type ProgressCallback = Callable[[CalibrationProgress], None]


def effective_grid(
    grid: Mapping[str, Sequence[str]], slots: int | None
) -> dict[str, list[str]]:
    """Return the grid as run: ``max_sequences`` beyond the server's slots dropped."""
    effective = {key: list(values) for key, values in grid.items()}
    if slots and "max_sequences" in effective:
        kept = [v for v in effective["max_sequences"] if int(v) <= slots]
        effective["max_sequences"] = kept or [str(slots)]
    return effective


def settings_run(grid: Mapping[str, Sequence[str]], current: Mapping[str, str]) -> int:
    """Return how many settings a sweep of ``grid`` and the current settings runs."""
    combos = combinations({key: list(values) for key, values in grid.items()}) or [{}]
    return len(combos) + (dict(current) not in combos)


def current_values(
    settings: SchedulerSettings, keys: Sequence[str], slots: int | None
) -> dict[str, str]:
    """Return the grid's settings as ``settings`` runs them, written as the grid writes them.

    Max sequences above the server's slots run as its slots (the server only queues the rest).
    """
    values: dict[str, str] = {}
    for key in keys:
        if "." in key:
            lane_key, limit = key.split(".", 1)
            value = getattr(
                settings.lanes[Lane.from_key(lane_key, settings.lanes)], limit
            )
        else:
            value = getattr(settings, key)
        if key == "max_sequences" and slots:
            value = min(int(value), slots)
        values[key] = str(value)
    return values


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    """The frontier table and what to apply."""

    rows: list[dict[str, Any]]
    """One per setting run: label, settings, goodput, good_per_s, output_tok_s, finished,
    frontier, classes."""
    recommended: SchedulerSettings
    recommended_values: dict[str, str]
    best_throughput_values: dict[str, str]
    explanation: str
    decision: Decision
    """Whether ``recommended_values`` may be applied, and why (not)."""
    current_values: dict[str, str]
    """The swept settings the server ran with before (one of the rows)."""
    curve: BatchCurve | None = None
    """The server's batch curve, measured first."""
    context: int | None = None
    """Tokens one request may hold at the server, where it says."""
    scaled_to_context: bool = False
    """Whether the scenario's prompts and answers were scaled down to fit ``context``."""

    def as_response(self) -> dict[str, Any]:
        """Plain JSON for the action's response data."""
        return {
            "curve": self.curve.as_dict() if self.curve is not None else None,
            "curve_plot": text_plot(self.curve) if self.curve is not None else None,
            "rows": self.rows,
            "current": self.current_values,
            "recommended": self.recommended_values,
            "best_throughput": self.best_throughput_values,
            "explanation": self.explanation,
            "verdict": self.decision.verdict.value,
            "verdict_reason": self.decision.reason,
            "context_per_slot": self.context,
            "scaled_to_context": self.scaled_to_context,
        }


def shorten(scenario: Scenario, duration_s: float) -> Scenario:
    """Cut the scenario to ``duration_s`` (warm-up kept to a sixth of it at most, later events dropped)."""
    return replace(
        scenario,
        duration_s=duration_s,
        warmup_s=min(scenario.warmup_s, duration_s / 6),
        events=tuple(event for event in scenario.events if event.at_s < duration_s),
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
    on_progress: ProgressCallback | None = None,
) -> CalibrationResult:
    """Run the grid and the current settings; recommend the setting with the highest goodput.

    ``max_sequences`` values above the server's slot count are dropped (the server would only
    queue them). ``base_settings`` are the current ones: the decision compares the pick with
    them. Takes the batch curve, then at most ``CalibrationPlan.settings_s``; ``on_progress``
    hears where it is: before the curve (with the plan), after it, after each setting, at the
    end.
    """
    loop = asyncio.get_running_loop()  # its clock: virtual time on a VirtualTimeLoop
    started = loop.time()
    server = await describe_server(backend, model)
    effective = effective_grid(grid, server.slots)
    current = current_values(base_settings, list(effective), server.slots)
    plan = CalibrationPlan(settings_run(effective, current), duration_s)
    done = 0

    def report(step: Step, setting: str | None = None) -> None:
        if on_progress is not None:
            on_progress(
                CalibrationProgress(
                    step=step,
                    settings_done=done,
                    settings_total=plan.settings,
                    elapsed_s=loop.time() - started,
                    remaining_s=(plan.settings - done) * plan.setting_s,
                    setting=setting,
                )
            )

    def row_done(row: SweepRow) -> None:
        nonlocal done
        done += 1
        report("setting", row.label)

    report("batch_curve")
    curve = await measure_curve(
        backend,
        server.model,
        server.slots or base_settings.max_sequences,
        time_scale=time_scale,
        context_tokens=server.context,
    )
    report("sweep")
    loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    fitted = loaded.fitted(server.context)
    result = await run_sweep(
        backend,
        shorten(fitted, duration_s),
        policies=[policy],
        base_settings=base_settings,
        grid=effective,
        server=server,
        time_scale=time_scale,
        on_row=row_done,
        also=[current],
    )
    report("done")
    best = result.best_goodput
    current_row = next(row for row in result.rows if row.overrides == current)
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
        decision=decide(result.rows, best, current_row, duration_s),
        current_values=current,
        curve=curve,
        context=server.context,
        scaled_to_context=fitted != loaded,
    )
