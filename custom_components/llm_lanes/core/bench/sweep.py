"""Run a scenario over a grid of settings and find the goodput frontier.

Each combination of the grid (and each policy asked for) is one run. A row is on the frontier
when no other row has both more goodput and more output tokens/s. The recommended setting is the
one with the highest goodput (ties: more tokens/s); it is shown next to the one with the highest
raw tokens/s, with one sentence on why they differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
import itertools
import secrets
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.report import build_report, objective_misses
from custom_components.llm_lanes.core.bench.runner import (
    BenchPolicy,
    RunResult,
    run_scenario,
)
from custom_components.llm_lanes.core.bench.servers import ServerDescription
from custom_components.llm_lanes.core.bench.workload import Scenario
from custom_components.llm_lanes.core.settings import SchedulerSettings


@dataclass(slots=True)
class SweepRow:
    """One run of the sweep."""

    policy: BenchPolicy
    overrides: dict[str, str]
    report: dict[str, Any]
    result: RunResult
    frontier: bool = False

    @property
    def label(self) -> str:
        """Short name of the combination, e.g. ``lanes max_sequences=4 prefill_budget=512``."""
        values = " ".join(f"{key}={value}" for key, value in self.overrides.items())
        return f"{self.policy} {values}".strip()

    @property
    def goodput(self) -> float:
        """Share of all requests sent that met their objectives."""
        value = self.report["goodput"]
        return 0.0 if value is None else float(value)

    @property
    def output_tok_s(self) -> float:
        """Output tokens per second."""
        return float(self.report["output_tok_s"])

    @property
    def finished(self) -> int:
        """Requests of the measured window that finished (what its goodput is a share of)."""
        return sum(int(stats["finished"]) for stats in self.report["classes"].values())

    @property
    def failed(self) -> int:
        """Requests of the run the server failed (an error, not a refusal at the door)."""
        return sum(1 for record in self.result.records if record.outcome == "error")

    def as_dict(self) -> dict[str, Any]:
        """Return a row of the frontier table as plain JSON (the HA action's response data)."""
        return {
            "label": self.label,
            "policy": self.policy,
            "settings": dict(self.overrides),
            "goodput": self.report["goodput"],
            "good_per_s": self.report["good_per_s"],
            "output_tok_s": self.report["output_tok_s"],
            "finished": self.finished,
            "failed": self.failed,
            "frontier": self.frontier,
            "classes": {
                name: {
                    "goodput": stats["goodput"],
                    "ttft_p95": stats["ttft_p95"],
                    "itl_p95": stats["itl_p95"],
                }
                for name, stats in self.report["classes"].items()
            },
        }


@dataclass(slots=True)
class SweepResult:
    """All rows, the two winners and the sentence that compares them."""

    rows: list[SweepRow]
    best_goodput: SweepRow
    best_throughput: SweepRow
    explanation: str


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """Parse ``key=v1,v2`` options into a grid."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise ValueError(f"--grid expects key=value1,value2; got {item!r}")
        grid[key.strip()] = [
            value.strip() for value in values.split(",") if value.strip()
        ]
    return grid


def combinations(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the grid, in a stable order."""
    keys = list(grid)
    return [
        dict(zip(keys, values, strict=True))
        for values in itertools.product(*(grid[k] for k in keys))
    ]


def mark_frontier(rows: list[SweepRow]) -> None:
    """Flag the rows that no other row beats on both goodput and tokens/s."""
    for row in rows:
        row.frontier = not any(
            other.goodput >= row.goodput
            and other.output_tok_s >= row.output_tok_s
            and (other.goodput > row.goodput or other.output_tok_s > row.output_tok_s)
            for other in rows
        )


def pick(rows: list[SweepRow]) -> tuple[SweepRow, SweepRow]:
    """Return (highest goodput, highest tokens/s); equal goodputs go to the faster setting.

    No tolerance band: a point of goodput traded for tokens/s can be a lane's objective lost
    (voice, say), which is exactly what the recommendation must not hide.
    """
    best_goodput = max(rows, key=lambda row: (row.goodput, row.output_tok_s))
    best_throughput = max(rows, key=lambda row: (row.output_tok_s, row.goodput))
    return best_goodput, best_throughput


def explain(best_goodput: SweepRow, best_throughput: SweepRow) -> str:
    """One sentence on why the goodput pick differs from the throughput pick."""
    if best_goodput is best_throughput:
        return (
            f"{best_goodput.label} gives both the most tokens/s ({best_goodput.output_tok_s:.0f}) "
            f"and the most goodput ({best_goodput.goodput:.0%}), so there is nothing to trade."
        )
    classes_fast = best_throughput.report["classes"]
    classes_good = best_goodput.report["classes"]
    worst = min(
        classes_fast,
        key=lambda name: (
            (classes_fast[name]["goodput"] or 0.0)
            - (classes_good[name]["goodput"] or 0.0)
        ),
    )
    fast = classes_fast[worst]
    finished, missed_ttft, missed_itl = objective_misses(best_throughput.result, worst)
    cls = next(c for c in best_throughput.result.scenario.classes if c.name == worst)
    detail = (
        f": of its {finished} finished requests {missed_itl} missed the "
        f"{cls.slo.itl_s * 1000:.0f} ms ITL objective and {missed_ttft} the "
        f"{cls.slo.ttft_s:g} s TTFT one"
    )
    share = (
        best_goodput.output_tok_s / best_throughput.output_tok_s
        if best_throughput.output_tok_s
        else 0.0
    )
    return (
        f"{best_throughput.label} moves the most tokens ({best_throughput.output_tok_s:.0f} tok/s) but "
        f"only {best_throughput.goodput:.0%} of requests meet their objectives, because the {worst} "
        f"class drops to {(fast['goodput'] or 0.0):.0%}{detail}; {best_goodput.label} keeps "
        f"{best_goodput.goodput:.0%} at {best_goodput.output_tok_s:.0f} tok/s ({share:.0%} of the peak)."
    )


async def run_sweep(
    backend: Backend,
    scenario: Scenario,
    *,
    policies: Sequence[BenchPolicy],
    base_settings: SchedulerSettings,
    grid: dict[str, list[str]],
    server: ServerDescription,
    time_scale: float = 1.0,
    prompt_scale: float = 1.0,
    progress_for: Callable[[str], Callable[[float, int], None] | None] | None = None,
    on_row: Callable[[SweepRow], None] | None = None,
    also: Sequence[dict[str, str]] = (),
) -> SweepResult:
    """Run every combination and policy; return the rows and the picks.

    ``also`` are settings run besides the grid's combinations (after them, each once), e.g. the
    ones the server runs with now, so a pick can be compared with them on the same measurements.
    """
    rows: list[SweepRow] = []
    # Fresh prompt text per row and per sweep, so the server's prompt cache favours no row.
    salt = secrets.token_hex(4)
    settings_run = combinations(grid) or [{}]
    for extra in also:
        if extra not in settings_run:
            settings_run.append(extra)
    for policy in policies:
        for overrides in settings_run:
            settings = base_settings.with_values(overrides)
            label = f"{policy} {' '.join(f'{k}={v}' for k, v in overrides.items())}"
            progress = progress_for(label) if progress_for is not None else None
            result = await run_scenario(
                backend,
                scenario,
                policy=policy,
                settings=settings,
                server=server,
                time_scale=time_scale,
                prompt_scale=prompt_scale,
                prompt_salt=f"{salt}:{label}:",
                progress=progress,
            )
            row = SweepRow(
                policy=policy,
                overrides=overrides,
                report=build_report(result),
                result=result,
            )
            rows.append(row)
            if on_row is not None:
                on_row(row)
    mark_frontier(rows)
    best_goodput, best_throughput = pick(rows)
    return SweepResult(
        rows=rows,
        best_goodput=best_goodput,
        best_throughput=best_throughput,
        explanation=explain(best_goodput, best_throughput),
    )


def format_table(result: SweepResult) -> str:
    """Render the frontier table as text (also valid Markdown)."""
    class_names = list(result.rows[0].report["classes"]) if result.rows else []
    header = [
        "setting",
        "goodput",
        "good/s",
        "out tok/s",
        *[f"{n} good" for n in class_names],
        "frontier",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result.rows:
        marks = []
        if row is result.best_goodput:
            marks.append("best goodput")
        if row is result.best_throughput:
            marks.append("most tok/s")
        cells = [
            row.label,
            f"{row.goodput:.0%}",
            f"{row.report['good_per_s']:.2f}",
            f"{row.output_tok_s:.0f}",
            *[
                "–"
                if row.report["classes"][n]["goodput"] is None
                else f"{row.report['classes'][n]['goodput']:.0%}"
                for n in class_names
            ],
            ("yes" if row.frontier else "")
            + (f" ({', '.join(marks)})" if marks else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
