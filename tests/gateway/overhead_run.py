"""The gateway's own cost: TTFT through the endpoint against the scheduler in-process, and 200 streams.

Not part of the test suite (it measures wall-clock time; run it on an idle machine) and not
collected by it: ``python -m tests.gateway.bench_overhead`` runs it. It starts Home Assistant's HTTP server (the test harness's, on loopback) with LLM Lanes in front
of an idle simulated llama.cpp, then, in one run:

1. **Overhead**: ``ROUNDS`` pairs of the same one-token chat, one sent to the scheduler in-process
   (``Scheduler.stream``) and one through the OpenAI endpoint with a plain aiohttp client (no SDK
   in the way), alternating, one at a time. Time to first token of each; the overhead is the
   difference of the medians (and the median of the pairs' differences).
2. **Concurrency**: ``STREAMS`` streams through the endpoint at once (the simulator has as many
   slots), each read to its end; every one must end with ``[DONE]`` and no error.

It prints a table for the README.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import aiohttp
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    OPT_HEADROOM,
    OPT_MAX_SEQUENCES,
    OPT_PREFILL_BUDGET,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.metrics import percentile
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from tests.support.entities import async_set_options
from tests.support.entries import MODEL
from tools.simulator.server import SimConfig

from .conftest import Gateway
from .samples import stream_lines

ROUNDS = 200
STREAMS = 200
TOKENS_PER_STREAM = 16
PROMPT = "What is the temperature in the living room?"


@pytest.fixture
def sim_config() -> SimConfig:
    """Simulate an idle llama.cpp at real speed, with a slot for each concurrent stream."""
    return SimConfig(slots=STREAMS, speed=1.0, kv_capacity_tokens=STREAMS * 512)


async def _first_token_in_process(entry: MockConfigEntry) -> float:
    request = ChatRequest(
        model=MODEL,
        messages=(ChatMessage(role="user", content=PROMPT),),
        max_tokens=1,
    )
    started = time.perf_counter()
    stream = entry.runtime_data.scheduler.stream(
        request, lane=Lane.INTERACTIVE, requester="bench:in-process"
    )
    try:
        async for chunk in stream:
            if chunk.text:
                return time.perf_counter() - started
    finally:
        await stream.aclose()
    raise AssertionError("no token")


def _body(max_tokens: int, *, ignore_eos: bool = False) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": max_tokens,
        **({"ignore_eos": True} if ignore_eos else {}),
    }


async def _stream(
    session: aiohttp.ClientSession, gateway: Gateway, key: str, body: dict[str, object]
) -> tuple[float, list[str]]:
    """Send one streamed chat; return its time to first token and its content pieces."""
    started = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    done = False
    async with session.post(
        f"{gateway.openai_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        assert response.status == 200, await response.text()
        async for payload in stream_lines(response, events=True):
            if payload == b"[DONE]":
                done = True
                continue
            event = json.loads(payload)
            assert "error" not in event, event
            for choice in event["choices"]:
                if text := choice["delta"].get("content"):
                    if first is None:
                        first = time.perf_counter() - started
                    pieces.append(text)
    assert done and first is not None
    return first, pieces


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


async def test_gateway_overhead(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """Measure, print, and check the targets (p50 overhead at most 2 ms; 200 streams, no error).

    The harness runs its event loop in debug mode, which records a traceback for every
    callback and future; Home Assistant does not, so neither does the measurement.
    """
    loop = asyncio.get_running_loop()
    debug = loop.get_debug()
    loop.set_debug(False)
    try:
        await _measure(hass, gateway, init_integration)
    finally:
        loop.set_debug(debug)


async def _measure(
    hass: HomeAssistant, gateway: Gateway, entry: MockConfigEntry
) -> None:
    """Take the measurements, print the table, check the targets."""
    await async_set_options(
        hass,
        entry,
        **{
            OPT_MAX_SEQUENCES: STREAMS,
            OPT_PREFILL_BUDGET: 1_048_576,
            OPT_HEADROOM: 0,
            "interactive": {"max_queued": 256},
        },
    )
    client = await gateway.add_client(entry, name="Benchmark")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm both paths (connections, first imports) before measuring.
        for _ in range(10):
            await _first_token_in_process(entry)
            await _stream(session, gateway, client.api_key, _body(1))
        direct: list[float] = []
        through: list[float] = []
        for _ in range(ROUNDS):
            direct.append(await _first_token_in_process(entry))
            through.append(
                (await _stream(session, gateway, client.api_key, _body(1)))[0]
            )

        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                _stream(
                    session,
                    gateway,
                    client.api_key,
                    _body(TOKENS_PER_STREAM, ignore_eos=True),
                )
                for _ in range(STREAMS)
            ),
            return_exceptions=True,
        )
        wall = time.perf_counter() - started

    errors = [r for r in results if isinstance(r, BaseException)]
    streams = [r for r in results if not isinstance(r, BaseException)]
    overheads = [t - d for d, t in zip(direct, through, strict=True)]
    overhead_p50 = statistics.median(through) - statistics.median(direct)
    concurrent_ttft = [first for first, _ in streams]
    rows = [
        ("TTFT p50, scheduler in-process", _ms(statistics.median(direct))),
        ("TTFT p50, through the endpoint", _ms(statistics.median(through))),
        ("gateway overhead, p50 (difference of the medians)", _ms(overhead_p50)),
        ("gateway overhead, median of the pairs' differences", _ms(statistics.median(overheads))),
        ("gateway overhead, p95 of the pairs' differences", _ms(percentile(sorted(overheads), 0.95))),
        (f"{STREAMS} concurrent streams: errors", str(len(errors))),
        (
            f"{STREAMS} concurrent streams: tokens",
            f"{sum(len(p) for _, p in streams)} of {STREAMS * TOKENS_PER_STREAM}",
        ),
        (f"{STREAMS} concurrent streams: TTFT p50 / p95", " / ".join(
            _ms(percentile(sorted(concurrent_ttft), q)) for q in (0.5, 0.95)
        )),
        (f"{STREAMS} concurrent streams: wall time", f"{wall:.2f} s"),
    ]  # fmt: skip
    table = "\n".join(
        ["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    )
    sys.stdout.write(
        f"\n{ROUNDS} rounds, idle simulated llama.cpp, one run:\n{table}\n"
    )
    assert not errors, errors[:3]
    assert all(len(pieces) == TOKENS_PER_STREAM for _, pieces in streams)
    assert overhead_p50 <= 0.002
