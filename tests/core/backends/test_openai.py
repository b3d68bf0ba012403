"""The OpenAI-compatible backend against loopback servers.

SSE parsing, tool-call assembly, usage, vLLM's priority and resume flags, and metrics; the real
llama-server has its own module.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web
import pytest

from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.errors import (
    BackendHTTPError,
    MalformedStreamError,
)
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    ToolCall,
)
from tools.simulator.server import SimConfig, SimulatedServer

from .conftest import (
    CHAT,
    Handler,
    Serve,
    fixture_text,
    json_handler,
    lines_handler,
    text_handler,
)

REQUEST = ChatRequest(model="m", messages=(ChatMessage(role="user", content="hello"),))


def sse(*events: dict[str, Any] | str) -> Handler:
    """Stream server-sent events (``[DONE]`` is appended)."""
    lines: list[str] = []
    for event in (*events, "[DONE]"):
        lines += [f"data: {event if isinstance(event, str) else json.dumps(event)}", ""]
    return lines_handler(lines, "text/event-stream")


def delta(**fields: Any) -> dict[str, Any]:
    """Build a chat.completion.chunk with one choice's delta."""
    finish = fields.pop("finish_reason", None)
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


async def collect(
    backend: OpenAIBackend, request: ChatRequest = REQUEST
) -> list[StreamChunk]:
    """Collect the whole stream."""
    return [chunk async for chunk in backend.chat(request)]


async def test_recorded_llama_cpp_stream(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """A stream recorded from the real llama-server: role chunk, 6 tokens, usage, [DONE]."""
    recorded = fixture_text("llamacpp/chat_stream.sse").splitlines()
    server = await serve({CHAT: lines_handler(recorded, "text/event-stream")})
    backend = OpenAIBackend(session, server.url, kind=ServerKind.LLAMA_CPP)
    chunks = await collect(backend)
    assert len(chunks) == 7
    assert chunks[0].text == "Serialization"
    final = chunks[-1]
    assert final.finish_reason == "length"
    assert final.usage is not None
    assert (final.usage.output_tokens, final.usage.source) == (6, "server")
    assert final.usage.prompt_tokens == 34
    (sent,) = server.received["/v1/chat/completions"]
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert "priority" not in sent


async def test_tool_calls_streamed_in_pieces(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """Two tool calls whose names and arguments arrive in interleaved pieces, keyed by index."""
    pieces = [
        delta(role="assistant", content=None),
        delta(
            tool_calls=[
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "turn_on"},
                }
            ]
        ),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"ro'}}]),
        delta(
            tool_calls=[
                {
                    "index": 1,
                    "id": "call_b",
                    "function": {"name": "set_temp", "arguments": ""},
                }
            ]
        ),
        delta(tool_calls=[{"index": 0, "function": {"arguments": 'om": "kitchen"}'}}]),
        delta(tool_calls=[{"index": 1, "function": {"arguments": '{"celsius": 21}'}}]),
        delta(finish_reason="tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 19}},
    ]
    server = await serve({CHAT: sse(*pieces)})
    backend = OpenAIBackend(session, server.url, kind=ServerKind.VLLM)
    final = (await collect(backend))[-1]
    assert final.tool_calls == (
        ToolCall(id="call_a", name="turn_on", arguments={"room": "kitchen"}),
        ToolCall(id="call_b", name="set_temp", arguments={"celsius": 21}),
    )
    assert final.finish_reason == "tool_calls"
    assert final.usage is not None and final.usage.output_tokens == 19


async def test_bad_tool_call_arguments(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """Arguments that never become JSON are a malformed stream, not a silent empty call."""
    pieces = [
        delta(
            tool_calls=[
                {"index": 0, "id": "x", "function": {"name": "f", "arguments": "{"}}
            ]
        ),
        delta(finish_reason="tool_calls"),
    ]
    server = await serve({CHAT: sse(*pieces)})
    backend = OpenAIBackend(session, server.url)
    with pytest.raises(
        MalformedStreamError, match="tool call arguments that are not JSON"
    ):
        await collect(backend)


async def test_usage_estimated_without_server_counts(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """No usage and no timings: the final chunk says the counts are estimates."""
    server = await serve(
        {
            CHAT: sse(
                delta(content="Hi"), delta(content="!"), delta(finish_reason="stop")
            )
        }
    )
    backend = OpenAIBackend(session, server.url, kind=ServerKind.LOCALAI)
    chunks = await collect(backend)
    assert [chunk.text for chunk in chunks[:-1]] == ["Hi", "!"]
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.source, usage.output_tokens, usage.prompt_tokens) == (
        "estimate",
        2,
        6,
    )


async def test_reasoning_tokens_count_but_show_no_text(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """Reasoning deltas cost tokens; only answer text reaches the caller."""
    server = await serve(
        {
            CHAT: sse(
                delta(reasoning_content="hmm"),
                delta(content="Yes"),
                delta(finish_reason="stop"),
            )
        }
    )
    chunks = await collect(OpenAIBackend(session, server.url))
    assert "".join(chunk.text for chunk in chunks) == "Yes"
    assert sum(chunk.output_tokens for chunk in chunks) == 2


VLLM_NO_PRIORITY = {
    "object": "error",
    "message": "Got priority 1 but Priority scheduling is not enabled.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


async def test_vllm_priority_dropped_after_a_400(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """VLLM without --scheduling-policy priority refuses ``priority``: retry once, stop sending."""
    answer = sse(delta(content="ok"), delta(finish_reason="stop"))

    async def handler(request: web.Request) -> web.StreamResponse:
        if "priority" in await request.json():
            return web.json_response(VLLM_NO_PRIORITY, status=400)
        return await answer(request)

    server = await serve({CHAT: handler})
    backend = OpenAIBackend(session, server.url, kind=ServerKind.VLLM)
    request = ChatRequest(model="m", messages=REQUEST.messages, priority=1)
    assert "".join(chunk.text for chunk in await collect(backend, request)) == "ok"
    assert "".join(chunk.text for chunk in await collect(backend, request)) == "ok"
    sent = server.received["/v1/chat/completions"]
    assert [body.get("priority") for body in sent] == [1, None, None]
    assert backend.send_priority is False


async def test_vllm_priority_kept_when_accepted(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """A vLLM server with priority scheduling gets the lane's priority on every request."""
    server = await serve({CHAT: sse(delta(content="ok"), delta(finish_reason="stop"))})
    backend = OpenAIBackend(session, server.url, kind=ServerKind.VLLM)
    await collect(
        backend, ChatRequest(model="m", messages=REQUEST.messages, priority=3)
    )
    assert server.received["/v1/chat/completions"][0]["priority"] == 3
    assert backend.send_priority is True


async def test_other_400s_are_not_retried(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """A 400 about something else is raised as is."""
    server = await serve(
        {CHAT: json_handler({"error": {"message": "context too long"}}, 400)}
    )
    backend = OpenAIBackend(session, server.url, kind=ServerKind.VLLM)
    with pytest.raises(BackendHTTPError, match="context too long"):
        await collect(
            backend, ChatRequest(model="m", messages=REQUEST.messages, priority=1)
        )
    assert len(server.received["/v1/chat/completions"]) == 1


async def test_vllm_resume_continues_the_final_message(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """VLLM needs continue_final_message and no generation prompt to continue a prefix."""
    server = await serve(
        {CHAT: sse(delta(content=" world"), delta(finish_reason="stop"))}
    )
    backend = OpenAIBackend(session, server.url, kind=ServerKind.VLLM)
    request = ChatRequest(
        model="m", messages=REQUEST.messages, assistant_prefix="Hello"
    )
    chunks = await collect(backend, request)
    assert "".join(chunk.text for chunk in chunks) == " world"
    (sent,) = server.received["/v1/chat/completions"]
    assert sent["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert sent["continue_final_message"] is True
    assert sent["add_generation_prompt"] is False


@pytest.mark.parametrize(
    ("deltas", "expected"),
    [
        (["Hel", "lo", " wor", "ld"], " world"),  # echoed in pieces, as llama.cpp does
        (["Hello world"], " world"),  # echo and new text in one delta
        (["Help"], "Help"),  # diverges: not an echo, nothing dropped
    ],
)
async def test_resume_echo_is_dropped(
    session: aiohttp.ClientSession, serve: Serve, deltas: list[str], expected: str
) -> None:
    """A server that streams the prefilled prefix back: the caller sees only new text."""
    events = [delta(content=text) for text in deltas]
    server = await serve({CHAT: sse(*events, delta(finish_reason="stop"))})
    backend = OpenAIBackend(session, server.url, kind=ServerKind.LLAMA_CPP)
    request = ChatRequest(
        model="m", messages=REQUEST.messages, assistant_prefix="Hello"
    )
    chunks = await collect(backend, request)
    assert "".join(chunk.text for chunk in chunks) == expected
    (sent,) = server.received["/v1/chat/completions"]
    assert (
        "continue_final_message" not in sent
    )  # llama.cpp continues a final assistant turn


async def test_request_body(session: aiohttp.ClientSession, serve: Serve) -> None:
    """Sampling options, stop, schema, tool messages and extra options reach the server."""
    server = await serve({CHAT: sse(delta(content="x"), delta(finish_reason="stop"))})
    backend = OpenAIBackend(
        session, server.url, kind=ServerKind.LM_STUDIO, api_key="sk-1"
    )
    call = ToolCall(id="c1", name="f", arguments={"a": 1})
    request = ChatRequest(
        model="m",
        messages=(
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="assistant", tool_calls=(call,)),
            ChatMessage(role="tool", content="done", tool_call_id="c1", name="f"),
        ),
        max_tokens=10,
        temperature=0.0,
        top_p=0.5,
        seed=1,
        stop=("END",),
        json_schema={"type": "object"},
        options={"top_k": 5},
    )
    await collect(backend, request)
    (sent,) = server.received["/v1/chat/completions"]
    assert sent["messages"][1]["tool_calls"] == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "f", "arguments": '{"a": 1}'},
        }
    ]
    assert sent["messages"][2] == {
        "role": "tool",
        "content": "done",
        "tool_call_id": "c1",
        "name": "f",
    }
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"], sent["seed"]) == (
        10,
        0.0,
        0.5,
        1,
    )
    assert sent["stop"] == ["END"]
    assert sent["top_k"] == 5
    assert sent["response_format"]["json_schema"]["schema"] == {"type": "object"}


async def test_api_key_is_sent(session: aiohttp.ClientSession, serve: Serve) -> None:
    """The key goes in a bearer header."""
    seen: list[str | None] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    server = await serve({"GET /v1/models": models})
    backend = OpenAIBackend(session, server.url, api_key="sk-1")
    assert await backend.list_models() == ("m",)
    assert seen == ["Bearer sk-1"]


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.42
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="qwen"} 7.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1200.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen"} 3400.0
"""


async def test_vllm_metrics(session: aiohttp.ClientSession, serve: Serve) -> None:
    """VLLM's /metrics becomes running/waiting/KV cache/preemptions."""
    server = await serve({"GET /metrics": text_handler(VLLM_METRICS)})
    metrics = await OpenAIBackend(session, server.url, kind=ServerKind.VLLM).metrics()
    assert (metrics.requests_running, metrics.requests_waiting) == (3, 2)
    assert metrics.kv_cache_usage == pytest.approx(0.42)
    assert metrics.preemptions == 7
    assert (metrics.prompt_tokens_total, metrics.output_tokens_total) == (1200, 3400)


async def test_recorded_llama_cpp_metrics(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """/metrics and /slots recorded from the real llama-server while one stream was running."""
    server = await serve(
        {
            "GET /metrics": text_handler(fixture_text("llamacpp/metrics_busy.txt")),
            "GET /slots": json_handler(
                json.loads(fixture_text("llamacpp/slots_busy.json"))
            ),
            "GET /v1/models": json_handler({"data": [{"id": "tiny-random-llama"}]}),
        }
    )
    metrics = await OpenAIBackend(
        session, server.url, kind=ServerKind.LLAMA_CPP
    ).metrics()
    assert (metrics.slots_total, metrics.slots_busy) == (4, 1)
    assert (metrics.requests_running, metrics.requests_waiting) == (1, 0)
    assert (metrics.prompt_tokens_total, metrics.output_tokens_total) == (35, 6)
    assert metrics.loaded_models == ("tiny-random-llama",)


async def test_llama_cpp_without_metrics_flag(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """Started without --metrics (501): slots still come from /slots."""
    not_supported = {
        "error": {
            "code": 501,
            "message": "This server does not support metrics endpoint.",
        }
    }
    server = await serve(
        {
            "GET /metrics": json_handler(not_supported, 501),
            "GET /slots": json_handler(
                json.loads(fixture_text("llamacpp/slots_busy.json"))
            ),
            "GET /v1/models": json_handler({"data": [{"id": "m"}]}),
            "GET /props": json_handler(json.loads(fixture_text("llamacpp/props.json"))),
        }
    )
    backend = OpenAIBackend(session, server.url, kind=ServerKind.LLAMA_CPP)
    metrics = await backend.metrics()
    assert metrics.slots_busy == 1
    assert metrics.requests_running is None
    info = await backend.server_info()
    assert info.metrics_enabled is False
    assert (info.slots, info.context_length) == (4, 1024)


async def test_simulated_llama_cpp(session: aiohttp.ClientSession) -> None:
    """The project's simulated llama.cpp server: a chat with server counts, and its slots."""
    async with SimulatedServer(SimConfig(slots=4, speed=200.0)) as sim:
        backend = OpenAIBackend(session, sim.url, kind=ServerKind.LLAMA_CPP)
        request = ChatRequest(
            model="sim-llama-8b", messages=REQUEST.messages, max_tokens=12
        )
        chunks = await collect(backend, request)
        final = chunks[-1]
        assert final.usage is not None and final.usage.source == "server"
        assert final.usage.output_tokens == sum(chunk.output_tokens for chunk in chunks)
        metrics = await backend.metrics()
        assert (metrics.slots_total, metrics.slots_busy) == (4, 0)
        assert (await backend.server_info()).slots == 4
