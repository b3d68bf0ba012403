"""The Ollama backend against recorded Ollama responses and the simulated Ollama server.

Recorded responses are replayed by a loopback server that also keeps what the client sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
import json

import aiohttp
import pytest

from custom_components.llm_lanes.core.backends.detect import connect
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.ollama import OllamaBackend
from custom_components.llm_lanes.core.errors import ModelNotFoundError
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    ToolCall,
    ToolSpec,
)
from tools.simulator.server import SimConfig, SimulatedServer

from .conftest import (
    FakeServer,
    Handler,
    Serve,
    fixture_text,
    json_handler,
    lines_handler,
)

WEATHER_TOOL = ToolSpec(
    name="get_current_weather",
    description="Get the current weather for a location",
    parameters={
        "type": "object",
        "properties": {
            "location": {"type": "string"},
            "format": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["location", "format"],
    },
)


def recorded(name: str) -> Handler:
    """Replay a recorded NDJSON stream line by line."""
    return lines_handler(fixture_text(f"ollama/{name}").splitlines())


def recorded_json(name: str) -> Handler:
    """Answer a recorded JSON document."""
    return json_handler(json.loads(fixture_text(f"ollama/{name}")))


async def collect(backend: OllamaBackend, request: ChatRequest) -> list[StreamChunk]:
    """Collect the whole stream."""
    return [chunk async for chunk in backend.chat(request)]


async def test_recorded_stream(session: aiohttp.ClientSession, serve: Serve) -> None:
    """A recorded stream: one token per line, the final line's counts from the server."""
    server = await serve({"POST /api/chat": recorded("chat_stream.ndjson")})
    backend = OllamaBackend(session, server.url)
    request = ChatRequest(
        model="llama3.2",
        messages=(ChatMessage(role="user", content="why is the sky blue?"),),
        max_tokens=64,
        temperature=0.2,
        top_p=0.9,
        seed=3,
        stop=("\n\n",),
        options={"num_ctx": 4096},
    )
    chunks = await collect(backend, request)
    assert [chunk.text for chunk in chunks[:-1]] == ["The", " sky", " is", " blue"]
    assert all(chunk.output_tokens == 1 for chunk in chunks[:-1])
    final = chunks[-1]
    assert final.done and final.finish_reason == "stop"
    assert final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.output_tokens) == (26, 282)
    assert final.usage.source == "server"
    (sent,) = server.received["/api/chat"]
    assert sent["stream"] is True
    assert sent["keep_alive"] == -1  # keeps the model resident
    assert sent["options"] == {
        "num_predict": 64,
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["\n\n"],
        "num_ctx": 4096,
    }


async def test_recorded_tool_call(session: aiohttp.ClientSession, serve: Serve) -> None:
    """Ollama sends whole tool calls (arguments as objects) in a message."""
    server = await serve({"POST /api/chat": recorded("chat_tool_call.ndjson")})
    backend = OllamaBackend(session, server.url)
    request = ChatRequest(
        model="llama3.2",
        messages=(
            ChatMessage(role="user", content="What is the weather today in Paris?"),
        ),
        tools=(WEATHER_TOOL,),
    )
    chunks = await collect(backend, request)
    calls = [call for chunk in chunks for call in chunk.tool_calls]
    assert calls == [
        ToolCall(
            id="call_0",
            name="get_current_weather",
            arguments={"format": "celsius", "location": "Paris, FR"},
        )
    ]
    assert chunks[-1].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.output_tokens == 33
    (sent,) = server.received["/api/chat"]
    assert sent["tools"][0]["function"]["name"] == "get_current_weather"
    assert sent["tools"][0]["function"]["parameters"] == WEATHER_TOOL.parameters


async def test_tool_results_and_resume_are_sent_in_ollama_shape(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """Send tool calls, tool results, a resume prefix and a schema in Ollama's shape.

    Tool calls go back as objects, tool results name their tool, a resume prefix is the final
    assistant message, a JSON schema becomes ``format``.
    """
    server = await serve({"POST /api/chat": recorded("chat_stream.ndjson")})
    backend = OllamaBackend(session, server.url, keep_alive="10m")
    call = ToolCall(
        id="c1", name="get_current_weather", arguments={"location": "Paris"}
    )
    request = ChatRequest(
        model="llama3.2",
        messages=(
            ChatMessage(role="user", content="weather?"),
            ChatMessage(role="assistant", tool_calls=(call,)),
            ChatMessage(
                role="tool",
                content="22 C",
                tool_call_id="c1",
                name="get_current_weather",
            ),
        ),
        assistant_prefix="It is 22",
        json_schema={"type": "object"},
    )
    await collect(backend, request)
    (sent,) = server.received["/api/chat"]
    assert sent["messages"] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "function": {
                        "name": "get_current_weather",
                        "arguments": {"location": "Paris"},
                    }
                }
            ],
        },
        {"role": "tool", "content": "22 C", "tool_name": "get_current_weather"},
        {"role": "assistant", "content": "It is 22"},
    ]
    assert sent["format"] == {"type": "object"}
    assert sent["keep_alive"] == "10m"


async def test_estimates_when_the_server_gives_no_counts(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """A final line without counts: usage is an estimate and says so."""
    lines = [
        json.dumps({"message": {"role": "assistant", "content": "Hi"}, "done": False}),
        json.dumps(
            {"message": {"role": "assistant", "content": " there"}, "done": False}
        ),
        json.dumps({"done": True, "done_reason": "length"}),
    ]
    server = await serve({"POST /api/chat": lines_handler(lines)})
    backend = OllamaBackend(session, server.url)
    request = ChatRequest(
        model="m", messages=(ChatMessage(role="user", content="x" * 40),)
    )
    final = (await collect(backend, request))[-1]
    assert final.finish_reason == "length"
    assert final.usage is not None
    assert final.usage.source == "estimate"
    assert final.usage.output_tokens == 2
    assert final.usage.prompt_tokens == 14  # 40 chars / 4 + 4 for the message frame


@pytest.fixture
async def recorded_ollama(serve: Serve) -> FakeServer:
    """Replay the recorded documents: version, installed and loaded models, a model load."""
    return await serve(
        {
            "GET /api/version": recorded_json("version.json"),
            "GET /api/tags": recorded_json("tags.json"),
            "GET /api/ps": recorded_json("ps.json"),
            "POST /api/chat": recorded_json("chat_load.json"),
        }
    )


async def test_recorded_info_and_metrics(
    session: aiohttp.ClientSession, recorded_ollama: FakeServer
) -> None:
    """Version, installed models and the loaded model come from the recorded documents."""
    backend = OllamaBackend(session, recorded_ollama.url + "/")
    info = await backend.server_info()
    assert info.kind is ServerKind.OLLAMA
    assert info.version == "0.5.1"
    assert info.models == ("codellama:13b", "llama3:latest")
    assert info.loaded_models == ("mistral:latest",)
    assert info.metrics_enabled is False
    assert info.unique_id.startswith("ollama@127.0.0.1:")
    assert (await backend.metrics()).loaded_models == ("mistral:latest",)


async def test_warm_up_loads_and_keeps_the_model(
    session: aiohttp.ClientSession, recorded_ollama: FakeServer
) -> None:
    """warm_up sends an empty chat with keep_alive and reports what /api/ps says."""
    backend = OllamaBackend(session, recorded_ollama.url)
    assert await backend.warm_up("mistral") is True  # "mistral" means "mistral:latest"
    assert await backend.warm_up("llama3.2") is False  # not in /api/ps
    sent = recorded_ollama.received["/api/chat"][0]
    assert sent == {
        "model": "mistral",
        "messages": [],
        "stream": False,
        "keep_alive": -1,
    }


# --- against the project's simulated Ollama server ------------------------------------------


@pytest.fixture
async def simulated_ollama() -> AsyncIterator[SimulatedServer]:
    """Run the benchmark's simulated server speaking Ollama's API, fast."""
    async with SimulatedServer(
        SimConfig(kind="ollama", model="sim-llama-8b", speed=200.0)
    ) as server:
        yield server


async def test_simulated_ollama(
    session: aiohttp.ClientSession, simulated_ollama: SimulatedServer
) -> None:
    """Detection, info, a streamed chat and a missing model against the simulator."""
    backend = await connect(session, simulated_ollama.url)
    assert isinstance(backend, OllamaBackend)
    info = await backend.server_info()
    assert info.kind is ServerKind.OLLAMA
    assert info.models == ("sim-llama-8b",)
    assert info.loaded_models == ("sim-llama-8b",)
    assert info.context_length == simulated_ollama.config.context_per_slot
    request = ChatRequest(
        model="sim-llama-8b",
        messages=(ChatMessage(role="user", content="Turn on the kitchen light"),),
        max_tokens=16,
    )
    chunks = [chunk async for chunk in backend.chat(request)]
    final = chunks[-1]
    assert final.done
    assert final.usage is not None and final.usage.source == "server"
    assert final.usage.output_tokens == sum(chunk.output_tokens for chunk in chunks)
    assert "".join(chunk.text for chunk in chunks)
    assert await backend.warm_up("sim-llama-8b") is True
    missing = ChatRequest(model="nope", messages=request.messages)
    with pytest.raises(ModelNotFoundError, match="'nope' is not available"):
        [chunk async for chunk in backend.chat(missing)]  # noqa: B018
