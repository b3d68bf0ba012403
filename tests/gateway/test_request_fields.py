"""What a client's request carries reaches the server, translated: sampling, stop, structured output."""

from __future__ import annotations

import json

import aiohttp
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tests.support.entries import MODEL
from tools.simulator.server import SimulatedServer

from .conftest import Gateway
from .samples import ROOM


def _sent(body: dict[str, object]) -> dict[str, object]:
    """Return the sampling settings the server got (Ollama: in ``options``; else at the top)."""
    options = body.get("options")
    return options if isinstance(options, dict) else body


async def test_openai_sampling_and_json_schema(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """temperature, top_p, seed, stop and max_completion_tokens pass; a JSON schema is followed."""
    client = await gateway.add_client(init_integration)
    answer = await gateway.openai(client.api_key).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Which room?"}],
        temperature=0.3,
        top_p=0.9,
        seed=42,
        stop=["\n\n"],
        max_completion_tokens=40,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "room", "schema": ROOM},
        },
    )
    assert json.loads(answer.choices[0].message.content or "")["room"] == "kitchen"
    sent = _sent(sim.requests_seen[-1])
    assert (sent["temperature"], sent["top_p"], sent["seed"], sent["stop"]) == (
        0.3,
        0.9,
        42,
        ["\n\n"],
    )
    assert sent.get("max_tokens", sent.get("num_predict")) == 40


async def test_ollama_format_and_options(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """Ollama's ``format`` (a schema) and ``options`` reach the server in its own terms."""
    client = await gateway.add_client(init_integration)
    answer = await gateway.ollama(client.api_key).chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Which room?"}],
        format=ROOM,
        options={"temperature": 0.2, "num_predict": 30, "seed": 7},
    )
    assert json.loads(answer.message.content or "")["room"] == "kitchen"
    sent = _sent(sim.requests_seen[-1])
    assert (sent["temperature"], sent["seed"]) == (0.2, 7)
    assert sent.get("max_tokens", sent.get("num_predict")) == 30


async def test_malformed_bodies_and_unknown_paths(
    gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """A body that is not JSON is a 400; an unknown path under either endpoint a 404, in shape."""
    client = await gateway.add_client(init_integration)
    headers = {"Authorization": f"Bearer {client.api_key}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gateway.openai_url}/chat/completions", data=b"{not json", headers=headers
        ) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "invalid_json"
        async with session.get(
            f"{gateway.openai_url}/files", headers=headers
        ) as response:
            assert response.status == 404
            assert (await response.json())["error"]["type"] == "not_found_error"
        async with session.post(
            f"{gateway.ollama_url(client.api_key)}/api/pull", json={"model": MODEL}
        ) as response:
            assert response.status == 404
            assert "no such endpoint" in (await response.json())["error"]
        async with session.get(gateway.ollama_url(client.api_key)) as response:
            assert await response.text() == "Ollama is running"
