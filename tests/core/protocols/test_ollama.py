"""The Ollama wire format: requests and streams converted both ways give back what went in."""

from __future__ import annotations

from dataclasses import replace
import json
from typing import Any

import pytest

from custom_components.llm_lanes.core.backends.base import (
    Answer,
    ChatMessage,
    ChatRequest,
    StreamChunk,
    TokenUsage,
    ToolCall,
    ToolSpec,
)
from custom_components.llm_lanes.core.errors import InvalidRequestError
from custom_components.llm_lanes.core.protocols import ollama, openai
from tests.core.fakes import FakeClock

WEATHER = ToolSpec(
    name="get_weather",
    description="Weather of a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
# Ollama carries no call ids: the server side numbers calls through the conversation.
CALLS = (
    ToolCall(id="call_0", name="get_weather", arguments={"city": "Paris"}),
    ToolCall(id="call_1", name="get_weather", arguments={"city": "Lyon"}),
)
REQUESTS = [
    ChatRequest(model="llama3.2", messages=(ChatMessage(role="user", content="hi"),)),
    ChatRequest(
        model="llama3.2",
        messages=(
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Weather in Paris and Lyon?"),
            ChatMessage(role="assistant", tool_calls=CALLS),
            ChatMessage(role="tool", content="22 C", name="get_weather"),
            ChatMessage(role="tool", content="19 C", name="get_weather"),
        ),
        tools=(WEATHER,),
        max_tokens=64,
        temperature=0.2,
        top_p=0.9,
        seed=3,
        stop=("\n\n",),
        assistant_prefix="Paris is",
        options={"num_ctx": 4096, "think": False, "keep_alive": "5m"},
    ),
    ChatRequest(
        model="m",
        messages=(ChatMessage(role="user", content="x"),),
        json_schema={"type": "object"},
    ),
    ChatRequest(
        model="m", messages=(ChatMessage(role="user", content="x"),), json_mode=True
    ),
]


def decode(request: ChatRequest, data: bytes) -> list[StreamChunk]:
    """Feed a whole NDJSON body to the client's decoder, as the backend does line by line."""
    decoder = ollama.StreamDecoder(request, "http://server")
    chunks: list[StreamChunk] = []
    for line in data.splitlines():
        chunks += decoder.feed(line)
        if decoder.done:
            return chunks
    return [*chunks, decoder.end()]


@pytest.mark.parametrize("request_", REQUESTS)
def test_request_round_trip(request_: ChatRequest) -> None:
    """A request written as a client body and read back by the server side is the same."""
    body = ollama.chat_body(request_, keep_alive=None)
    parsed = ollama.parse_chat(json.loads(json.dumps(body)))
    assert parsed.request == request_
    assert parsed.stream is True


def test_body_places_options_where_ollama_reads_them() -> None:
    """Sampling in ``options``; keep_alive and think at the top; the request's keep_alive wins."""
    body = ollama.chat_body(REQUESTS[1], keep_alive=-1)
    assert body["options"] == {
        "num_predict": 64,
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["\n\n"],
        "num_ctx": 4096,
    }
    assert (body["keep_alive"], body["think"]) == ("5m", False)
    assert ollama.chat_body(REQUESTS[0], keep_alive=-1)["keep_alive"] == -1
    assert "keep_alive" not in ollama.chat_body(REQUESTS[0], keep_alive=None)
    assert ollama.chat_body(REQUESTS[3], keep_alive=None)["format"] == "json"


def test_an_openai_request_reaches_ollama_with_its_options() -> None:
    """A gateway client's extra OpenAI fields go into Ollama's options."""
    parsed = openai.parse_chat(
        {
            "model": "llama3.2",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 10,
            "top_k": 20,
        }
    )
    body = ollama.chat_body(parsed.request, keep_alive=None)
    assert body["options"] == {"num_predict": 10, "top_k": 20}


CHUNKS = [
    StreamChunk(text="It", output_tokens=1),
    StreamChunk(text=" is", output_tokens=1),
    StreamChunk(tool_calls=CALLS),
    StreamChunk(
        done=True, finish_reason="tool_calls", usage=TokenUsage(26, 12, "server")
    ),
]


def test_stream_round_trip_with_durations() -> None:
    """Lines written and read back give the same answer; durations come from the clock."""
    clock = FakeClock(100.0)
    encoder = ollama.StreamEncoder(model="llama3.2", clock=clock, wall_clock=lambda: 0)
    data = b""
    for chunk in CHUNKS:
        clock.advance(0.25)
        data += encoder.ndjson(chunk)
    chunks = decode(REQUESTS[0], data)
    assert Answer.of(chunks) == Answer.of(CHUNKS)
    final = json.loads(data.splitlines()[-1])
    assert final["created_at"] == "1970-01-01T00:00:00Z"
    assert (final["done"], final["done_reason"]) == (True, "stop")
    assert (final["prompt_eval_count"], final["eval_count"]) == (26, 12)
    assert final["prompt_eval_duration"] == 250_000_000
    assert final["eval_duration"] == 750_000_000
    assert final["total_duration"] == 1_000_000_000


def test_whole_response_for_a_client_that_does_not_stream() -> None:
    """The single object holds all the text, the tool calls and the counts."""
    encoder = ollama.StreamEncoder(model="m", clock=FakeClock(), wall_clock=lambda: 0)
    for chunk in CHUNKS:
        encoder.feed(chunk)
    response = encoder.response()
    assert response["done"] is True
    assert response["message"]["content"] == "It is"
    assert [call["function"] for call in response["message"]["tool_calls"]] == [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Lyon"}},
    ]
    assert response["eval_count"] == 12


def test_length_and_unknown_counts() -> None:
    """A cut answer says length; without usage the output is counted from the chunks."""
    encoder = ollama.StreamEncoder(model="m", clock=FakeClock(), wall_clock=lambda: 0)
    lines = encoder.feed(StreamChunk(text="a", output_tokens=1))
    lines += encoder.feed(StreamChunk(done=True, finish_reason="length"))
    assert lines[-1]["done_reason"] == "length"
    assert lines[-1]["eval_count"] == 1
    assert "prompt_eval_count" not in lines[-1]


def test_parse_a_typical_client_request() -> None:
    """num_predict -1 sets no limit; a one-word stop is a list of one; stream defaults on."""
    parsed = ollama.parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
            ],
            "options": {"num_predict": -1, "stop": "END"},
        }
    )
    request = parsed.request
    assert request.max_tokens is None
    assert request.stop == ("END",)
    assert request.messages[1].tool_calls == (
        ToolCall(id="call_0", name="f", arguments={"a": 1}),
    )
    assert request.assistant_prefix == ""
    assert parsed.stream is True
    # Nothing else was asked for.
    assert replace(request, messages=(), stop=()) == ChatRequest(model="m", messages=())


def test_empty_conversation_loads_the_model() -> None:
    """Ollama's load request (no messages) is valid."""
    parsed = ollama.parse_chat({"model": "m", "messages": [], "stream": False})
    assert parsed.request.messages == ()
    assert parsed.stream is False


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
    }
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("text", "request"),
        ({"messages": []}, "model"),
        (_body(messages={"role": "user"}), "messages"),
        (_body(messages=[{"content": "x"}]), "messages[0].role"),
        (
            _body(messages=[{"role": "user", "content": "x", "images": ["AAAA"]}]),
            "messages[0].images",
        ),
        (
            _body(
                messages=[
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
                    }
                ]
            ),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (_body(options=[]), "options"),
        (_body(options={"temperature": "hot"}), "options.temperature"),
        (_body(options={"num_predict": 1.5}), "options.num_predict"),
        (_body(format=3), "format"),
        (_body(stream="no"), "stream"),
        (_body(tools=[{"function": {"name": 1}}]), "tools[0].function.name"),
    ],
)
def test_parse_errors_name_the_field(body: Any, field: str) -> None:
    """A malformed request raises one typed error that names the bad field."""
    with pytest.raises(InvalidRequestError) as caught:
        ollama.parse_chat(body)
    assert caught.value.field == field
