"""The ``ollama`` package against the gateway's Ollama-compatible endpoint.

Each test runs in front of a simulated Ollama and a simulated llama.cpp (``conftest.sim_config``):
the Ollama API is served whatever the server behind.
"""

from __future__ import annotations

import ollama
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.core.lanes import Lane
from tests.support.entries import MODEL
from tests.support.requests import finished_requests
from tools.simulator.server import SimConfig, SimulatedServer

from .conftest import Gateway
from .samples import LIGHTS, TURN_ON
from .sim import embedding_of


async def test_streamed_chat(
    gateway: Gateway, init_integration: MockConfigEntry, sim_config: SimConfig
) -> None:
    """A streamed chat arrives line by line, the last with the counts; the client's lane ran it."""
    client, api = await gateway.add_ollama_client(init_integration, lane="automation")
    finished = finished_requests(init_integration)

    parts = [
        part
        async for part in await api.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "What time is it?"}],
            stream=True,
            options={"num_predict": 10, "num_ctx": 8192},
            keep_alive=0,
        )
    ]
    texts = [part.message.content for part in parts if part.message.content]
    assert len(texts) >= 2
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].eval_count == len(texts)
    assert parts[-1].prompt_eval_count
    assert [(f.lane, f.requester, f.outcome) for f in finished] == [
        (Lane.AUTOMATION, client.requester, "ok")
    ]


async def test_server_owned_options_stay_out(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """A client's context size and keep-alive never reach the server; sampling options do."""
    _, api = await gateway.add_ollama_client(init_integration)
    await api.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        options={"num_ctx": 8192, "top_k": 20, "temperature": 0.1},
        keep_alive=0,
    )
    body = sim.requests_seen[-1]
    sent = body.get("options", body)  # Ollama: in options; llama.cpp: at the top level
    assert sent["top_k"] == 20
    assert sent["temperature"] == 0.1
    assert "num_ctx" not in sent
    assert body.get("keep_alive") != 0


async def test_tool_call(gateway: Gateway, init_integration: MockConfigEntry) -> None:
    """A tool call comes with its arguments as an object."""
    _, api = await gateway.add_ollama_client(init_integration)
    answer = await api.chat(
        model=MODEL,
        messages=TURN_ON,
        tools=[LIGHTS],
    )
    (call,) = answer.message.tool_calls or []
    assert call.function.name == "HassTurnOn"
    assert call.function.arguments == {"name": "Kitchen light"}


async def test_tags_show_ps(
    gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """The model documents describe the server's model, whatever the server."""
    _, api = await gateway.add_ollama_client(init_integration)
    assert [model.model for model in (await api.list()).models] == [MODEL]
    shown = await api.show(MODEL)
    assert "tools" in (shown.capabilities or [])
    assert [model.model for model in (await api.ps()).models] == [MODEL]
    with pytest.raises(ollama.ResponseError) as err:
        await api.show("no-such-model")
    assert err.value.status_code == 404


async def test_generate_and_embed(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """``/api/generate`` answers a prompt (raw: continued as it is); ``/api/embed`` passes through."""
    _, api = await gateway.add_ollama_client(init_integration)

    templated = await api.generate(model=MODEL, prompt="Hello", system="Be brief")
    assert templated.response
    assert templated.done
    raw = [
        part.response
        async for part in await api.generate(
            model=MODEL,
            prompt="The kitchen",
            raw=True,
            stream=True,
            options={"num_predict": 4},
        )
    ]
    assert "".join(raw)
    assert sim.requests_seen[-1]["prompt"] == "The kitchen"

    loaded = await api.generate(model=MODEL, prompt="")
    assert loaded.done_reason == "load"

    embedded = await api.embed(model=MODEL, input=["kitchen", "garage"])
    assert [list(vector) for vector in embedded.embeddings] == [
        pytest.approx(embedding_of("kitchen")),
        pytest.approx(embedding_of("garage")),
    ]
    assert embedded.prompt_eval_count
