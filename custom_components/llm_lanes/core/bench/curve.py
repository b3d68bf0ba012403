"""The server's batch curve: inter-token latency and tokens per second against sequences in flight.

For n = 1, 2, ... up to the server's slots, n identical streams run at once (a short prompt, a
fixed number of output tokens); their gaps give the ITL at that batch size and their tokens the
throughput. A long prompt sent alone gives the prefill speed. From the curve follow the settings
a household would otherwise have to guess:

- ``max_sequences``: the smallest batch that reaches ``KNEE_SHARE`` of the best throughput
  (more sequences only slow everyone's tokens);
- ``prefill_guard_tokens``: the prompt the server prefills within voice's inter-token objective
  (a longer background prompt would stall a voice answer's tokens);
- the learned background limit starts from the measured curve instead of from nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
import math
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.report import percentile
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.slot_context import BENCH_FILL

KNEE_SHARE = 0.95
"""A batch reaching this share of the best throughput is big enough."""
STREAM_TOKENS = 48
"""Output tokens of each stream of a batch."""
PREFILL_PROBE_WORDS = 600
"""Words of the long prompt that measures the prefill speed (roughly 800 tokens by the estimate;
up to 2,400 for a tokenizer that splits every digit, as Qwen's does)."""
PROBE_TOKENS_PER_WORD = 4
"""The most tokens one word of the probe (``w`` and up to three digits) takes."""
PREFILL_PROBE_ROUNDS = 3
"""Times each prefill probe is timed (the quickest counts)."""


def prefill_probe_words(context_tokens: int | None) -> int:
    """Words of the prefill probe: ``PREFILL_PROBE_WORDS``, or what fits the server's slot.

    On a small slot the probe fills at most ``BENCH_FILL`` of it even if every word takes
    ``PROBE_TOKENS_PER_WORD`` tokens (a longer one is refused by the server, HTTP 400).
    """
    if not context_tokens or context_tokens <= 0:
        return PREFILL_PROBE_WORDS
    fitting = int(BENCH_FILL * context_tokens) // PROBE_TOKENS_PER_WORD
    return max(16, min(PREFILL_PROBE_WORDS, fitting))


@dataclass(frozen=True, slots=True)
class BatchPoint:
    """One batch size of the curve."""

    sequences: int
    itl_p50_s: float | None
    itl_p95_s: float | None
    output_tok_s: float

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class BatchCurve:
    """The measured curve and the prefill speed."""

    points: list[BatchPoint]
    prefill_tok_s: float | None

    def knee(self) -> int:
        """Return the smallest batch reaching ``KNEE_SHARE`` of the best throughput."""
        best = max(point.output_tok_s for point in self.points)
        return next(
            point.sequences
            for point in self.points
            if point.output_tok_s >= KNEE_SHARE * best
        )

    def guard_tokens(self, itl_objective_s: float) -> int | None:
        """Prompt tokens the server prefills within ``itl_objective_s`` (None: not measured)."""
        if not self.prefill_tok_s:
            return None
        return max(
            64, min(65536, round(self.prefill_tok_s * itl_objective_s / 64) * 64)
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {
            "points": [point.as_dict() for point in self.points],
            "prefill_tok_s": self.prefill_tok_s,
            "knee": self.knee(),
        }


def _now() -> float:
    """Return the running loop's clock: real time, or virtual time on a ``VirtualTimeLoop``."""
    return asyncio.get_running_loop().time()


def _request(backend: Backend, model: str, text: str, tokens: int) -> ChatRequest:
    options: dict[str, Any] = {}
    if backend.profile.takes_ignore_eos:
        options["ignore_eos"] = True
    return ChatRequest(
        model=model,
        messages=(ChatMessage(role="user", content=text),),
        max_tokens=tokens,
        temperature=0.0,
        options=options,
    )


async def _stream(backend: Backend, request: ChatRequest) -> tuple[list[float], int]:
    """Send one request; return the arrival time of each output chunk and the tokens."""
    times: list[float] = []
    tokens = 0
    async for chunk in backend.chat(request):
        if chunk.output_tokens:
            times.append(_now())
            tokens += chunk.output_tokens
    return times, tokens


async def measure_batch(
    backend: Backend, model: str, sequences: int, *, time_scale: float = 1.0
) -> BatchPoint:
    """Run ``sequences`` identical streams at once and measure their gaps and throughput."""
    started = _now()
    results = await asyncio.gather(
        *(
            _stream(
                backend,
                _request(
                    backend,
                    model,
                    f"Count slowly, run {index}: one two three",
                    STREAM_TOKENS,
                ),
            )
            for index in range(sequences)
        )
    )
    elapsed = (_now() - started) * time_scale
    gaps = [
        (later - earlier) * time_scale
        for times, _ in results
        for earlier, later in zip(times, times[1:], strict=False)
    ]
    tokens = sum(count for _, count in results)
    return BatchPoint(
        sequences=sequences,
        itl_p50_s=percentile(gaps, 50),
        itl_p95_s=percentile(gaps, 95),
        output_tok_s=tokens / elapsed if elapsed > 0 else 0.0,
    )


async def measure_prefill(
    backend: Backend,
    model: str,
    *,
    time_scale: float = 1.0,
    context_tokens: int | None = None,
) -> float | None:
    """Prompt tokens per second: a long prompt's first token, less a short prompt's.

    The long prompt fits ``context_tokens`` (the server's slot), where given. Each is timed
    ``PREFILL_PROBE_ROUNDS`` times, on texts the server has not seen, and the quickest counts.
    """

    async def first_token(text: str) -> tuple[float, int]:
        started = _now()
        prompt = 0
        first: float | None = None
        async for chunk in backend.chat(_request(backend, model, text, 1)):
            if first is None and (chunk.output_tokens or chunk.text):
                first = _now()
            if chunk.usage is not None:
                prompt = chunk.usage.prompt_tokens_evaluated
        return ((first or _now()) - started) * time_scale, prompt

    words = prefill_probe_words(context_tokens)
    shorts: list[tuple[float, int]] = []
    longs: list[tuple[float, int]] = []
    for probe in range(PREFILL_PROBE_ROUNDS):
        # Each round's texts are new to the server, so no prompt cache shortens them.
        shorts.append(await first_token(f"Say hello, {probe}."))
        longs.append(
            await first_token(
                f"p{probe}: " + " ".join(f"w{index}" for index in range(words))
            )
        )
    # The quickest of each: a probe the machine's other work held up says nothing of the prefill.
    short_s, short_tokens = min(shorts)
    long_s, long_tokens = min(longs)
    if long_tokens <= short_tokens or long_s <= short_s:
        return None
    return (long_tokens - short_tokens) / (long_s - short_s)


async def measure_curve(
    backend: Backend,
    model: str,
    max_sequences: int,
    *,
    time_scale: float = 1.0,
    context_tokens: int | None = None,
) -> BatchCurve:
    """Measure the batch curve up to ``max_sequences`` and the prefill speed.

    Every request fits ``context_tokens`` (the server's slot), where given.
    """
    points = [
        await measure_batch(backend, model, sequences, time_scale=time_scale)
        for sequences in range(1, max(1, max_sequences) + 1)
    ]
    return BatchCurve(
        points=points,
        prefill_tok_s=await measure_prefill(
            backend, model, time_scale=time_scale, context_tokens=context_tokens
        ),
    )


def plot_curve(curve: BatchCurve, path: Any) -> None:
    """Draw ITL (p50, p95) and output tokens/s against sequences in flight into a PNG."""
    from custom_components.llm_lanes.core.bench.report import _pyplot  # noqa: PLC0415  (matplotlib only when drawing)

    plt = _pyplot()
    figure, itl_axis = plt.subplots(figsize=(6, 3.6))
    sizes = [point.sequences for point in curve.points]
    for attribute, label in (("itl_p50_s", "ITL p50"), ("itl_p95_s", "ITL p95")):
        values = [
            1000 * value if (value := getattr(point, attribute)) is not None else None
            for point in curve.points
        ]
        itl_axis.plot(sizes, values, marker="o", label=label)
    itl_axis.set_xlabel("sequences in flight")
    itl_axis.set_ylabel("inter-token latency (ms)")
    rate_axis = itl_axis.twinx()
    rate_axis.plot(
        sizes,
        [point.output_tok_s for point in curve.points],
        marker="s",
        color="tab:green",
        label="output tok/s",
    )
    rate_axis.set_ylabel("output tokens/s")
    lines = itl_axis.get_legend_handles_labels()
    rates = rate_axis.get_legend_handles_labels()
    itl_axis.legend(lines[0] + rates[0], lines[1] + rates[1], loc="upper left")
    itl_axis.set_xticks(sizes)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def text_plot(curve: BatchCurve, width: int = 40) -> str:
    """Draw the curve as a few lines of text (for the action's response)."""
    best = max(point.output_tok_s for point in curve.points) or 1.0
    lines = []
    for point in curve.points:
        bar = "#" * max(1, round(width * point.output_tok_s / best))
        itl = "–" if point.itl_p50_s is None else f"{point.itl_p50_s * 1000:.1f} ms"
        lines.append(
            f"{point.sequences:>2} seq  ITL p50 {itl:>9}  {point.output_tok_s:8.1f} tok/s {bar}"
        )
    return "\n".join(lines)


Y_DIVISIONS = 4
"""Divisions of the chart's height: both vertical axes are ticked at the same heights."""


STEP_FACTORS = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)
"""Round steps (times a power of ten): none is more than 1.5 times the one before, so the
axis's top is at most 1.5 times the maximum."""


def nice_step(top: float, divisions: int = Y_DIVISIONS) -> float:
    """Return the smallest round step (``STEP_FACTORS``) whose ``divisions`` reach ``top``."""
    if top <= 0:
        return 1.0
    raw = top / divisions
    power = 10.0 ** math.floor(math.log10(raw))
    return next(factor * power for factor in STEP_FACTORS if factor * power >= raw)


def _tick(value: float) -> str:
    return f"{round(value, 6):g}"


def svg_plot(curve: BatchCurve, *, width: int = 480, height: int = 260) -> str:
    """Draw the curve as a small SVG chart (no plotting library: Home Assistant serves it).

    Blue: ITL p50 (left axis, ms); green: output tokens/s (right axis). Both axes are ticked
    from 0 at the same heights; the titles say the measured maxima.
    """
    left, right, top, bottom = 48, 56, 28, 36
    inner_w, inner_h = width - left - right, height - top - bottom
    sizes = [point.sequences for point in curve.points]
    itls = [1000 * (point.itl_p50_s or 0.0) for point in curve.points]
    rates = [point.output_tok_s for point in curve.points]
    itl_step, rate_step = nice_step(max(itls)), nice_step(max(rates))
    itl_top, rate_top = itl_step * Y_DIVISIONS, rate_step * Y_DIVISIONS
    span = max(sizes[-1] - sizes[0], 1)

    def x(size: int) -> float:
        return left + inner_w * (size - sizes[0]) / span

    def y(division: int) -> float:
        return top + inner_h * (1 - division / Y_DIVISIONS)

    def polyline(values: list[float], top_value: float, color: str) -> str:
        points = " ".join(
            f"{x(size):.1f},{top + inner_h * (1 - value / top_value):.1f}"
            for size, value in zip(sizes, values, strict=True)
        )
        return f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>'

    x_ticks = "".join(
        f'<line x1="{x(size):.1f}" y1="{height - bottom}" x2="{x(size):.1f}" '
        f'y2="{height - bottom + 4}" stroke="#999"/>'
        f'<text class="x-tick" x="{x(size):.1f}" y="{height - bottom + 16}" '
        f'text-anchor="middle">{size}</text>'
        for size in sizes
    )
    y_ticks = "".join(
        f'<line x1="{left}" y1="{y(n):.1f}" x2="{width - right}" y2="{y(n):.1f}" '
        'stroke="#eee"/>'
        f'<text class="itl-tick" x="{left - 4}" y="{y(n) + 4:.1f}" text-anchor="end" '
        f'fill="#1f77b4">{_tick(n * itl_step)}</text>'
        f'<text class="rate-tick" x="{width - right + 4}" y="{y(n) + 4:.1f}" '
        f'fill="#2ca02c">{_tick(n * rate_step)}</text>'
        for n in range(Y_DIVISIONS + 1)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">'
        f"{y_ticks}"
        f'<rect x="{left}" y="{top}" width="{inner_w}" height="{inner_h}" fill="none" '
        'stroke="#999"/>'
        f"{polyline(itls, itl_top, '#1f77b4')}{polyline(rates, rate_top, '#2ca02c')}"
        f"{x_ticks}"
        f'<text class="itl-title" x="{left}" y="{top - 10}" fill="#1f77b4">ITL p50 (ms), '
        f"measured max {max(itls):.1f}</text>"
        f'<text class="rate-title" x="{width - right}" y="{top - 10}" text-anchor="end" '
        f'fill="#2ca02c">output tok/s, measured max {max(rates):.1f}</text>'
        f'<text x="{left + inner_w / 2:.0f}" y="{height - 4}" text-anchor="middle">'
        "sequences in flight</text></svg>"
    )
