"""The ablation: each voice-first mechanism switched against the defaults, side by side.

``scripts/bench ablate --server engine:costs=gpu --scenario assist_evening ...`` runs, on one
server and per scenario, ``direct``, ``lanes`` with its defaults, and ``lanes`` with one
mechanism switched (off where it is on by default, on where it is off), and says of each
mechanism whether it pays there: what voice and background get with it, against without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
import secrets
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.report import percentile
from custom_components.llm_lanes.core.bench.runner import (
    BenchPolicy,
    Progress,
    RunResult,
    run_scenario,
)
from custom_components.llm_lanes.core.bench.servers import ServerDescription
from custom_components.llm_lanes.core.bench.workload import Scenario
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings

NOISE = 0.05
"""The least change of a figure that counts; the defaults' two runs (first and last) widen it
to what the same settings give twice, on each axis."""
NO_LIMIT = "1000"
"""``background_with_voice`` that never binds: the learned background limit switched off."""
NO_GUARD = "1000000"
"""``prefill_guard_tokens`` no prompt exceeds: the prefill guard switched off."""


@dataclass(frozen=True, slots=True)
class Mechanism:
    """A voice-first mechanism and the settings that switch it from its default."""

    name: str
    switched: dict[str, str]
    on_by_default: bool = True


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism("slot placement (warm slots)", {"slot_placement": "false"}),
    Mechanism("headroom", {"headroom": "0"}),
    Mechanism("learned headroom", {"learn_headroom": "true"}, on_by_default=False),
    Mechanism("prefill guard", {"prefill_guard_tokens": NO_GUARD}),
    Mechanism("prefill steps", {"prefill_step_s": "0"}),
    Mechanism("preemption", {"preemption": "false"}),
    Mechanism("learned background limit", {"background_with_voice": NO_LIMIT}),
    Mechanism("announcements", {"announcements": "false"}),
)


@dataclass(frozen=True, slots=True)
class LaneFigures:
    """What one run gave voice and background."""

    voice_ttft_p50: float | None
    voice_ttft_p95: float | None
    voice_itl_p95: float | None
    voice_finished: int
    background_tok_s: float

    @classmethod
    def of(cls, results: Sequence[RunResult]) -> LaneFigures:
        """Pool the runs of one setting (several seeds): voice's requests, background's tokens."""
        ttfts: list[float] = []
        gaps: list[float] = []
        finished = 0
        tokens = 0
        window = 0.0
        for result in results:
            lane_of = {c.name: c.lane for c in result.scenario.classes}
            voice = [
                r
                for r in result.records
                if lane_of[r.class_name] is Lane.VOICE and r.outcome == "ok"
            ]
            ttfts += [r.ttft_s for r in voice if r.ttft_s is not None]
            gaps += [gap for r in voice for gap in r.gaps]
            finished += len(voice)
            start, end = result.scenario.warmup_s, result.scenario.duration_s
            window += end - start
            tokens += sum(
                count
                for r in result.records
                if lane_of[r.class_name] is Lane.BACKGROUND
                for at, count in zip(r.token_times, r.token_counts, strict=True)
                if start <= at <= end
            )
        return cls(
            voice_ttft_p50=percentile(ttfts, 50),
            voice_ttft_p95=percentile(ttfts, 95),
            voice_itl_p95=percentile(gaps, 95),
            voice_finished=finished,
            background_tok_s=tokens / max(window, 1e-9),
        )


async def run_seeds(
    backend: Backend,
    scenario: Scenario,
    *,
    policy: BenchPolicy,
    settings: SchedulerSettings,
    server: ServerDescription,
    seeds: int,
    salt: str,
    time_scale: float,
    prompt_scale: float,
    progress: Progress | None,
) -> LaneFigures:
    """Run one setting ``seeds`` times (the scenario's seed, then the next ones) and pool them."""
    results = [
        await run_scenario(
            backend,
            replace(scenario, seed=scenario.seed + offset),
            policy=policy,
            settings=settings,
            server=server,
            time_scale=time_scale,
            prompt_scale=prompt_scale,
            prompt_salt=f"{salt}:{offset}:",
            progress=progress,
        )
        for offset in range(seeds)
    ]
    return LaneFigures.of(results)


@dataclass(frozen=True, slots=True)
class AblationRow:
    """One run of the ablation."""

    label: str
    overrides: dict[str, str]
    figures: LaneFigures


@dataclass(frozen=True, slots=True)
class Verdict:
    """A mechanism against the same settings without it."""

    mechanism: Mechanism
    with_it: LaneFigures
    without_it: LaneFigures
    voice_noise: float = NOISE
    background_noise: float = NOISE

    @property
    def voice_gain(self) -> float | None:
        """How many times lower voice's TTFT p95 is with the mechanism (>1: it helps voice)."""
        on, off = self.with_it.voice_ttft_p95, self.without_it.voice_ttft_p95
        return None if not on or off is None else off / on

    @property
    def background_gain(self) -> float | None:
        """Background's tokens/s with the mechanism against without it (>1: it helps)."""
        off = self.without_it.background_tok_s
        return None if not off else self.with_it.background_tok_s / off

    @property
    def word(self) -> str:
        """``pays``, ``trade``, ``costs`` or ``no effect`` (changes within the noise are none)."""
        signs = [
            0 if gain is None or abs(gain - 1) <= noise else (1 if gain > 1 else -1)
            for gain, noise in (
                (self.voice_gain, self.voice_noise),
                (self.background_gain, self.background_noise),
            )
        ]
        if signs == [0, 0]:
            return "no effect"
        if min(signs) >= 0:
            return "pays"
        if max(signs) <= 0:
            return "costs"
        return "trade"


@dataclass(frozen=True, slots=True)
class Ablation:
    """The runs of one scenario and the verdict on each mechanism."""

    scenario: str
    rows: list[AblationRow]
    verdicts: list[Verdict]


async def run_ablation(
    backend: Backend,
    scenario: Scenario,
    *,
    server: ServerDescription,
    base_settings: SchedulerSettings,
    mechanisms: Sequence[Mechanism] = MECHANISMS,
    seeds: int = 1,
    time_scale: float = 1.0,
    prompt_scale: float = 1.0,
    progress_for: Callable[[str], Progress | None] | None = None,
    between: Callable[[], Awaitable[None]] | None = None,
) -> Ablation:
    """Run direct, the defaults, each mechanism switched and the defaults again; judge them.

    Each setting runs ``seeds`` times; ``between`` runs before each setting (waiting until the
    server is idle, so one run's leftovers do not slow the next).
    """
    salt = secrets.token_hex(4)
    runs: list[tuple[str, BenchPolicy, dict[str, str]]] = [
        ("direct", "direct", {}),
        ("lanes (defaults)", "lanes", {}),
    ]
    runs += [
        (
            f"lanes, {m.name} {'off' if m.on_by_default else 'on'}",
            "lanes",
            dict(m.switched),
        )
        for m in mechanisms
    ]
    runs.append(("lanes (defaults, again)", "lanes", {}))
    rows: list[AblationRow] = []
    for label, policy, overrides in runs:
        if between is not None:
            await between()
        figures = await run_seeds(
            backend,
            scenario,
            policy=policy,
            settings=base_settings.with_values(overrides),
            server=server,
            seeds=seeds,
            salt=f"{salt}:{label}",
            time_scale=time_scale,
            prompt_scale=prompt_scale,
            progress=progress_for(label) if progress_for is not None else None,
        )
        rows.append(AblationRow(label, overrides, figures))
    defaults, again = rows[1].figures, rows[-1].figures
    voice_noise = max(NOISE, _spread(defaults.voice_ttft_p95, again.voice_ttft_p95))
    background_noise = max(
        NOISE, _spread(defaults.background_tok_s, again.background_tok_s)
    )
    verdicts = [
        Verdict(m, defaults, row.figures, voice_noise, background_noise)
        if m.on_by_default
        else Verdict(m, row.figures, defaults, voice_noise, background_noise)
        for m, row in zip(mechanisms, rows[2:-1], strict=True)
    ]
    return Ablation(scenario.name, rows, verdicts)


def _spread(first: float | None, second: float | None) -> float:
    """How far apart two runs of the same settings are, as a share of the smaller."""
    if first is None or second is None or not min(first, second):
        return 0.0
    return abs(first - second) / min(first, second)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def ablation_markdown(ablation: Ablation, profile: str) -> str:
    """Render the runs and the verdicts of one scenario as Markdown tables."""
    lines = [
        f"### {ablation.scenario} on {profile}",
        "",
        "| run | voice TTFT p50 ms | p95 ms | voice ITL p95 ms | voice done | background tok/s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {row.label} | {_ms(row.figures.voice_ttft_p50)} | {_ms(row.figures.voice_ttft_p95)} "
        f"| {_ms(row.figures.voice_itl_p95)} | {row.figures.voice_finished} "
        f"| {row.figures.background_tok_s:.1f} |"
        for row in ablation.rows
    ]
    lines += [
        "",
        "| mechanism | voice TTFT p95, without / with | background tok/s, with / without | verdict |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {v.mechanism.name} | {_x(v.voice_gain)} | {_x(v.background_gain)} | {v.word} |"
        for v in ablation.verdicts
    ]
    if ablation.verdicts:
        first = ablation.verdicts[0]
        lines += [
            "",
            (
                f"Noise (the defaults run twice): voice p95 {first.voice_noise:.0%}, "
                f"background {first.background_noise:.0%}; changes within it are no effect."
            ),
        ]
    return "\n".join(lines) + "\n"


def ablation_dict(ablation: Ablation) -> dict[str, Any]:
    """Return the runs and verdicts of one scenario as plain JSON."""
    return {
        "scenario": ablation.scenario,
        "runs": [
            {"label": row.label, "settings": row.overrides, **asdict(row.figures)}
            for row in ablation.rows
        ],
        "mechanisms": {
            v.mechanism.name: {
                "voice_gain": v.voice_gain,
                "background_gain": v.background_gain,
                "verdict": v.word,
            }
            for v in ablation.verdicts
        },
    }
