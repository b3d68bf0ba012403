"""The simulated server: both APIs, the backend clients' detection, slots, queue, cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
import json
from typing import Any

import aiohttp
import pytest

from custom_components.llm_lanes.core.backends.detect import connect, detect_server_kind
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from tests.core.boxes import run_virtual
from tools.bench.prefill_delay import PrefillDelay, measure_prefill_delay
from tools.simulator.engine import Engine, EngineCosts
from tools.simulator.inprocess import EngineBackend
from tools.simulator.server import SimConfig, SimulatedServer

StartSim = Callable[[SimConfig], Awaitable[SimulatedServer]]
FAST = 200.0
"""Speed factor: a 10 ms iteration takes 50 µs."""


async def _until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) until the condition holds; the bound is a hang guard, not a timing check."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.001)


async def _lines(response: aiohttp.ClientResponse) -> list[str]:
    return [line.decode().strip() async for line in response.content if line.strip()]


async def test_openai_stream_shape(
    start_sim: StartSim, session: aiohttp.ClientSession
) -> None:
    """SSE deltas, a finish reason, a usage chunk and [DONE], as llama-server sends them."""
    sim = await start_sim(SimConfig(speed=FAST))
    body = {
        "model": "anything",
        "messages": [{"role": "user", "content": "x" * 400}],
        "max_tokens": 12,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with session.post(f"{sim.url}/v1/chat/completions", json=body) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        lines = await _lines(response)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    texts = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    assert sum(1 for t in texts if t) == 12
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {
        "prompt_tokens": 104,
        "completion_tokens": 12,
        "total_tokens": 116,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # llama.cpp says in the last choice chunk what it evaluated and took from its cache.
    assert events[-2]["timings"] == {"cache_n": 0, "prompt_n": 104, "predicted_n": 12}


async def test_openai_non_stream_and_models(
    start_sim: StartSim, session: aiohttp.ClientSession
) -> None:
    """A plain completion and the model list."""
    sim = await start_sim(SimConfig(speed=FAST, model="m1"))
    async with session.get(f"{sim.url}/v1/models") as response:
        assert (await response.json())["data"][0]["id"] == "m1"
    body = {
        "model": "m1",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 5,
    }
    async with session.post(f"{sim.url}/v1/chat/completions", json=body) as response:
        data = await response.json()
    assert data["object"] == "chat.completion"
    assert data["usage"]["completion_tokens"] == len(
        data["choices"][0]["message"]["content"].split()
    )


async def test_llama_cpp_endpoints(
    start_sim: StartSim, session: aiohttp.ClientSession
) -> None:
    """/props, /health, /slots and /metrics in llama.cpp's format."""
    sim = await start_sim(SimConfig(speed=FAST, slots=3, kv_capacity_tokens=12288))
    async with session.get(f"{sim.url}/props") as response:
        props = await response.json()
    assert props["total_slots"] == 3
    assert props["default_generation_settings"]["n_ctx"] == 4096
    async with session.get(f"{sim.url}/health") as response:
        assert await response.json() == {"status": "ok"}
    async with session.get(f"{sim.url}/slots") as response:
        slots = await response.json()
    assert [s["is_processing"] for s in slots] == [False] * 3
    async with session.get(f"{sim.url}/metrics") as response:
        text = await response.text()
    assert "# TYPE llamacpp:prompt_tokens_total counter" in text
    assert "llamacpp:requests_deferred 0" in text
    async with session.get(f"{sim.url}/api/version") as response:
        assert response.status == 404  # not an Ollama server


async def test_ollama_api_shape(
    start_sim: StartSim, session: aiohttp.ClientSession
) -> None:
    """NDJSON chat with prompt_eval_count/eval_count, tags, ps, version, show; unknown models 404."""
    sim = await start_sim(SimConfig(kind="ollama", speed=FAST, model="llama3.1:8b"))
    body = {
        "model": "llama3.1:8b",
        "messages": [{"role": "user", "content": "hello there"}],
        "options": {"num_predict": 7, "ignore_eos": True},
    }
    async with session.post(f"{sim.url}/api/chat", json=body) as response:
        lines = [json.loads(line) for line in await _lines(response)]
    assert [line["done"] for line in lines] == [False] * 7 + [True]
    assert lines[-1]["eval_count"] == 7
    assert lines[-1]["prompt_eval_count"] == 4 + 3
    assert lines[-1]["done_reason"] == "length"
    for path in ("/api/tags", "/api/ps"):
        async with session.get(f"{sim.url}{path}") as response:
            assert (await response.json())["models"][0]["name"] == "llama3.1:8b"
    async with session.get(f"{sim.url}/api/version") as response:
        assert "version" in await response.json()
    async with session.post(
        f"{sim.url}/api/show", json={"model": "llama3.1:8b"}
    ) as response:
        assert "tools" in (await response.json())["capabilities"]
    async with session.post(
        f"{sim.url}/api/chat", json={**body, "model": "other"}
    ) as response:
        assert response.status == 404
    async with session.post(
        f"{sim.url}/api/chat", json={"model": "llama3.1:8b", "messages": []}
    ) as response:
        assert (await response.json())["done_reason"] == "load"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("llama_cpp", ServerKind.LLAMA_CPP), ("ollama", ServerKind.OLLAMA)],
)
async def test_backend_detection_and_tool_call(
    start_sim: StartSim, session: aiohttp.ClientSession, kind: Any, expected: ServerKind
) -> None:
    """The real backend clients detect the simulator's kind and get a tool call through it."""
    sim = await start_sim(SimConfig(kind=kind, speed=FAST))
    assert await detect_server_kind(session, sim.url) is expected
    backend = await connect(session, sim.url)
    info = await backend.server_info()
    assert info.kind is expected
    from custom_components.llm_lanes.core.model import ToolSpec  # noqa: PLC0415

    request = ChatRequest(
        model=sim.config.model,
        messages=(ChatMessage(role="user", content='HassTurnOn name="Kitchen light"'),),
        tools=(
            ToolSpec(
                name="HassTurnOn",
                description="turn on",
                parameters={
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                },
            ),
        ),
    )
    chunks = [chunk async for chunk in backend.chat(request)]
    calls = [call for chunk in chunks for call in chunk.tool_calls]
    assert [(c.name, c.arguments) for c in calls] == [
        ("HassTurnOn", {"name": "Kitchen light"})
    ]
    assert chunks[-1].done


async def test_full_slots_queue_first_come_first_served(
    start_sim: StartSim, session: aiohttp.ClientSession
) -> None:
    """With one slot busy, the next request waits in the server's queue and starts when it frees."""
    sim = await start_sim(SimConfig(slots=1, speed=1.0))
    body: dict[str, Any] = {
        "model": "m", "messages": [{"role": "user", "content": "long"}],
        "max_tokens": 100_000, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    first = await session.post(f"{sim.url}/v1/chat/completions", json=body)
    await first.content.readline()
    await _until(lambda: len(sim.engine.running) == 1)
    second_task = asyncio.create_task(
        session.post(f"{sim.url}/v1/chat/completions", json={**body, "max_tokens": 3})
    )
    await _until(lambda: len(sim.engine.waiting) == 1)
    async with session.get(f"{sim.url}/metrics") as response:
        assert "llamacpp:requests_deferred 1" in await response.text()
    await _until(lambda: sim.engine.running[0].generated > 0)
    first.close()  # the client goes away: its slot frees and the queued request runs
    second = await second_task
    lines = await _lines(second)
    assert lines[-1] == "data: [DONE]"
    await _until(lambda: not sim.engine.running and not sim.engine.waiting)
    assert sim.engine.stats.cancelled_total == 1


async def test_cancel_on_disconnect_frees_the_slot(
    start_sim: StartSim, session: aiohttp.ClientSession
) -> None:
    """Closing a stream mid-way cancels the sequence at the server."""
    sim = await start_sim(SimConfig(kind="ollama", speed=1.0))
    body = {
        "model": sim.config.model,
        "messages": [{"role": "user", "content": "go"}],
        "options": {"num_predict": 100_000, "ignore_eos": True},
    }
    response = await session.post(f"{sim.url}/api/chat", json=body)
    await response.content.readline()
    assert len(sim.engine.running) == 1
    response.close()
    await _until(lambda: not sim.engine.running)
    assert sim.engine.stats.cancelled_total == 1


async def test_engine_preempts_when_the_cache_is_full() -> None:
    """Sequences that outgrow the KV cache are preempted, recomputed, and still finish whole."""
    engine = Engine(
        slots=4,
        kv_capacity_tokens=600,
        prefill_chunk_tokens=None,
        costs=EngineCosts(),
        speed=FAST,
    )
    engine.start()
    try:
        sequences = [engine.submit(100, 120) for _ in range(4)]
        counts = []
        for seq in sequences:
            tokens = []
            while (index := await seq.tokens.get()) is not None:
                tokens.append(index)
            counts.append(tokens)
    finally:
        await engine.stop()
    assert engine.stats.preemptions_total > 0
    assert all(tokens == list(range(120)) for tokens in counts)
    assert engine.stats.tokens_predicted_total == 4 * 120


async def test_chunked_prefill_spreads_a_long_prompt() -> None:
    """A 5,000-token prompt with a 2,048 budget takes three iterations before its first token."""
    engine = Engine(
        slots=2,
        kv_capacity_tokens=20000,
        prefill_chunk_tokens=2048,
        costs=EngineCosts(),
        speed=FAST,
    )
    engine.start()
    try:
        seq = engine.submit(5000, 1)
        assert await seq.tokens.get() == 0
        assert await seq.tokens.get() is None
    finally:
        await engine.stop()
    assert engine.stats.prompt_tokens_total == 5000
    assert engine.stats.decode_iterations_total == 0


def test_speed_must_be_positive() -> None:
    """A zero speed factor is refused."""
    with pytest.raises(ValueError, match="speed"):
        SimulatedServer(SimConfig(speed=0))


def test_prefill_delay_measures_the_wait_behind_a_long_prompt() -> None:
    """Beside a long prefill done in one pass, a short request waits for the pass.

    The simulator's engine on virtual time: the waits are its cost model's, whatever the load.
    """

    async def run() -> PrefillDelay:
        return await measure_prefill_delay(
            EngineBackend(), "engine", samples=4, background_words=1500
        )

    delay = run_virtual(run)
    assert delay.samples == 4
    assert delay.background_prefill_s is not None
    assert delay.idle_p50_s is not None and delay.idle_p95_s is not None
    assert delay.loaded_p50_s is not None and delay.loaded_p95_s is not None
    # Alone, a voice request is one pass of its own short prompt; beside the long prompt it
    # waits for some of that pass, which is many times longer.
    assert delay.idle_p95_s < 0.1 * delay.background_prefill_s
    assert delay.loaded_p50_s > delay.idle_p95_s
    assert delay.loaded_p95_s <= delay.background_prefill_s + delay.idle_p95_s
