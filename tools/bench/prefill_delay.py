"""How long a background prompt in prefill holds up a voice command's first token.

A server that evaluates a whole batch of prompt tokens in one pass (llama.cpp's ``--batch-size``,
2,048 by default) makes a request that arrives meanwhile wait for the pass to end. This measures
it directly, with no scheduler in between: a voice-sized request alone (the idle baseline), then
the same request sent while a long prompt is being prefilled (sent a moment after it), many times
each. The ratio of the two TTFT percentiles is what server flags such as ``--batch-size`` and
``--ubatch-size`` change (the scheduler's own remedy, prefilling in steps, is measured by the
scenarios).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
import random
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.bench.report import percentile
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest


@dataclass(frozen=True, slots=True)
class PrefillDelay:
    """Voice TTFT alone and beside a long prefill (seconds)."""

    samples: int
    idle_p50_s: float | None
    idle_p95_s: float | None
    loaded_p50_s: float | None
    loaded_p95_s: float | None
    background_prefill_s: float | None
    """How long the long prompt's first token took alone (its prefill)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return asdict(self)


def _request(model: str, text: str, tokens: int) -> ChatRequest:
    return ChatRequest(
        model=model,
        messages=(ChatMessage(role="user", content=text),),
        max_tokens=tokens,
        temperature=0.0,
    )


def _now() -> float:
    """Return the running loop's clock (virtual time on a ``VirtualTimeLoop``)."""
    return asyncio.get_running_loop().time()


async def _first_token_s(backend: Backend, request: ChatRequest) -> float:
    started = _now()
    first: float | None = None
    async for chunk in backend.chat(request):
        if first is None and (chunk.output_tokens or chunk.text):
            first = _now()
    return (first or _now()) - started


async def measure_prefill_delay(
    backend: Backend,
    model: str,
    *,
    samples: int = 40,
    background_words: int = 2000,
    seed: int = 1,
) -> PrefillDelay:
    """Measure voice TTFT alone and while a ``background_words`` prompt is being prefilled."""
    rng = random.Random(seed)

    def voice(index: int) -> ChatRequest:
        return _request(model, f"#{index} Turn on the kitchen light, please.", 4)

    def background(index: int) -> ChatRequest:
        words = " ".join(f"w{rng.getrandbits(24):x}" for _ in range(background_words))
        return _request(model, f"#{index} Summarize: {words}", 1)

    prefill = [await _first_token_s(backend, background(-1 - i)) for i in range(3)]
    prefill_s = sorted(prefill)[1]
    idle: list[float] = []
    loaded: list[float] = []
    for index in range(samples):
        idle.append(await _first_token_s(backend, voice(index)))
        long_prompt = asyncio.create_task(_first_token_s(backend, background(index)))
        # Arrive somewhere inside the prefill, as a command does at a random moment.
        await asyncio.sleep(rng.uniform(0.0, 0.8) * prefill_s)
        loaded.append(await _first_token_s(backend, voice(samples + index)))
        await long_prompt
    return PrefillDelay(
        samples=samples,
        idle_p50_s=percentile(idle, 50),
        idle_p95_s=percentile(idle, 95),
        loaded_p50_s=percentile(loaded, 50),
        loaded_p95_s=percentile(loaded, 95),
        background_prefill_s=prefill_s,
    )
