"""A distributed engine behind one OpenAI-compatible URL is one server of the pool.

vLLM with tensor or pipeline parallelism, llm-d, vLLM's production stack or KServe all answer
as vLLM does at one URL. This loopback server speaks vLLM's documented wire formats (``/v1/models``
with ``owned_by: vllm``, ``max_model_len`` and ``root``; ``/version``; ``/metrics`` with
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``; server-sent chat completions)
and records what it is sent. LLM Lanes passes each lane's priority down (vLLM's ``priority``,
lower first, with ``--scheduling-policy priority``) and routes by the queue the engine reports:
work waiting inside it sends voice to the mini PC until its queue is gone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
import json
from typing import Any

from aiohttp import web
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.router import ANY_MODEL
from custom_components.llm_lanes.household import household_of
from tools.simulator.server import SimulatedServer

from .support.entries import FAST_SIM, async_set_up
from .support.pool import GPU_RANKS, async_set_up_mini, pool_member_entry

ENGINE_MODEL = "Qwen/Qwen3-8B"


@dataclass
class Engine:
    """A vLLM-shaped engine on loopback: what it reports, and the chat bodies it received."""

    url: str = ""
    waiting: int = 0
    running: int = 0
    chats: list[dict[str, Any]] = field(default_factory=list)

    def metrics(self) -> str:
        """``/metrics`` as vLLM documents its gauges (one engine, labelled by model)."""
        labels = f'engine="0",model_name="{ENGINE_MODEL}"'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {float(self.running)}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {float(self.waiting)}\n"
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.1\n"
        )


async def _models(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": ENGINE_MODEL,
                    "object": "model",
                    "created": 1700000000,
                    "owned_by": "vllm",
                    "root": "/models/Qwen3-8B-AWQ",
                    "parent": None,
                    "max_model_len": 32768,
                }
            ],
        }
    )


@pytest.fixture
async def engine(socket_enabled: None) -> AsyncIterator[Engine]:
    """Serve the vLLM-shaped engine on a free loopback port."""
    state = Engine()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.chats.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index, word in enumerate(["Sure", ",", " done", "."]):
            event = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "model": ENGINE_MODEL,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": word}
                        if index == 0
                        else {"content": word},
                        "finish_reason": "stop" if index == 3 else None,
                    }
                ],
            }
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        usage = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16},
        }
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=state.metrics(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/version", _version)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    await runner.cleanup()


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.11.0"})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({})


@pytest.fixture
async def household_with_engine(
    ha_core: HomeAssistant, engine: Engine
) -> AsyncIterator[tuple[MockConfigEntry, MockConfigEntry]]:
    """Set up the engine as the preferred server, a fast mini PC second."""
    hass = ha_core
    async with SimulatedServer(FAST_SIM) as mini_sim:
        cluster = await async_set_up(
            hass,
            pool_member_entry(
                engine.url,
                "GPU cluster",
                GPU_RANKS,
                kind="vllm",
                model=ENGINE_MODEL,
                agent="Cluster agent",
            ),
        )
        mini = await async_set_up_mini(hass, mini_sim.url)
        yield cluster, mini
        for entry in (cluster, mini):
            if entry.state is ConfigEntryState.LOADED:
                assert await hass.config_entries.async_unload(entry.entry_id)


async def test_the_engine_gets_each_lane_s_priority_and_its_queue_routes(
    hass: HomeAssistant,
    engine: Engine,
    household_with_engine: tuple[MockConfigEntry, MockConfigEntry],
) -> None:
    """Voice goes to the engine with vLLM's priority of its lane, unless work waits inside it."""
    cluster, mini = household_with_engine
    pool = household_of(hass)
    request = ChatRequest(
        model=ANY_MODEL, messages=(ChatMessage(role="user", content="lights off"),)
    )

    async def ask(lane: Lane) -> str | None:
        result = await pool.pool.generate(request, lane=lane, requester="user:anna")
        assert result.finished.outcome == "ok"
        return result.finished.server

    assert await ask(Lane.VOICE) == cluster.entry_id
    assert await ask(Lane.BACKGROUND) == cluster.entry_id
    assert [body["priority"] for body in engine.chats] == [
        Lane.VOICE.rank,
        Lane.BACKGROUND.rank,
    ]
    assert engine.chats[0]["model"] == ENGINE_MODEL  # the engine's own model

    # Another client's work queues inside the engine: the next poll tells the pool.
    engine.waiting, engine.running = 40, 8
    await cluster.runtime_data.server.async_refresh()
    assert await ask(Lane.VOICE) == mini.entry_id
    engine.waiting = 0
    await cluster.runtime_data.server.async_refresh()
    assert await ask(Lane.VOICE) == cluster.entry_id
