"""The ``openai`` package against the gateway's OpenAI-compatible endpoint (simulated llama.cpp)."""

from __future__ import annotations

import json

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.core.lanes import Lane
from tests.support.entries import MODEL
from tests.support.requests import finished_requests
from tools.simulator.server import SimulatedServer

from .conftest import Gateway
from .samples import LIGHTS, TURN_ON, delta_texts
from .sim import embedding_of


async def test_streamed_chat_is_scheduled_for_the_client(
    gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """A streamed chat arrives token by token, with usage; the client's lane and requester ran it."""
    client, api = await gateway.add_openai_client(init_integration, lane="voice")
    finished = finished_requests(init_integration)

    stream = await api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What time is it?"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=10,
    )
    events = [event async for event in stream]

    texts = delta_texts(events)
    assert len(texts) >= 2  # one event per token
    assert events[-1].usage is not None
    assert events[-1].usage.completion_tokens == len(texts)
    finish = [
        e.choices[0].finish_reason
        for e in events
        if e.choices and e.choices[0].finish_reason
    ]
    assert finish in (["stop"], ["length"])
    assert [(f.lane, f.requester, f.outcome) for f in finished] == [
        (Lane.VOICE, client.requester, "ok")
    ]
    assert finished[0].output_tokens == len(texts)


async def test_whole_chat_and_a_tool_call(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """A chat that is not streamed comes whole; a tool call comes with its arguments."""
    _, api = await gateway.add_openai_client(init_integration)

    answer = await api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Good morning"}]
    )
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0

    called = await api.chat.completions.create(
        model=MODEL,
        messages=TURN_ON,
        tools=[LIGHTS],
    )
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "HassTurnOn"
    assert json.loads(call.function.arguments) == {"name": "Kitchen light"}
    # The server got the tool as the client offered it.
    assert sim.requests_seen[-1]["tools"][0]["function"]["name"] == "HassTurnOn"


async def test_models_and_embeddings(
    gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """The model list is the server's; embeddings (base64 by default in the SDK) are passed through."""
    client, api = await gateway.add_openai_client(init_integration, lane="background")
    finished = finished_requests(init_integration)

    models = [model.id async for model in await api.models.list()]
    assert models == [MODEL]
    assert (await api.models.retrieve(MODEL)).id == MODEL

    embedded = await api.embeddings.create(model=MODEL, input=["kitchen", "garage"])
    # Sent as base64 float32 (the SDK asks for it), decoded by the SDK.
    assert [item.embedding for item in embedded.data] == [
        pytest.approx(embedding_of("kitchen")),
        pytest.approx(embedding_of("garage")),
    ]
    assert embedded.usage.prompt_tokens > 0
    assert [(f.lane, f.requester, f.outcome, f.output_tokens) for f in finished] == [
        (Lane.BACKGROUND, client.requester, "ok", 0)
    ]
    assert finished[0].prompt_tokens == embedded.usage.prompt_tokens


async def test_raw_completion(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """``/v1/completions`` continues the prompt as it is, streamed or not."""
    _, api = await gateway.add_openai_client(init_integration)

    whole = await api.completions.create(
        model=MODEL, prompt="The kitchen", max_tokens=5
    )
    assert whole.choices[0].text
    assert sim.requests_seen[-1]["prompt"] == "The kitchen"

    stream = await api.completions.create(
        model=MODEL, prompt="The kitchen", max_tokens=5, stream=True
    )
    pieces = [event.choices[0].text async for event in stream if event.choices]
    assert "".join(pieces) == whole.choices[0].text


async def test_home_assistant_token_is_a_user(
    gateway: Gateway,
    init_integration: MockConfigEntry,
    hass_access_token: str,
    hass_admin_user: object,
) -> None:
    """A Home Assistant access token works on the OpenAI endpoint: its user, interactive lane."""
    finished = finished_requests(init_integration)
    api = gateway.openai(hass_access_token)
    answer = await api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    assert answer.choices[0].message.content
    assert [(f.lane, f.requester) for f in finished] == [
        (Lane.INTERACTIVE, f"user:{hass_admin_user.id}")  # type: ignore[attr-defined]
    ]
