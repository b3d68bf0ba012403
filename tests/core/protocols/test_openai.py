"""The OpenAI wire format: requests and streams converted both ways give back what went in."""

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
from custom_components.llm_lanes.core.protocols import openai
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens

LIGHT = ToolSpec(
    name="HassTurnOn",
    description="Turn on a device",
    parameters={"type": "object", "properties": {"name": {"type": "string"}}},
)
CALL = ToolCall(id="call_a1", name="HassTurnOn", arguments={"name": "Kitchen light"})
CONVERSATION = (
    ChatMessage(role="system", content="You are a home assistant."),
    ChatMessage(role="user", content="Turn on the kitchen light"),
    ChatMessage(role="assistant", tool_calls=(CALL,)),
    ChatMessage(
        role="tool", content='{"ok": true}', tool_call_id="call_a1", name="HassTurnOn"
    ),
)
REQUESTS = [
    ChatRequest(model="m", messages=(ChatMessage(role="user", content="hi"),)),
    ChatRequest(
        model="llama",
        messages=CONVERSATION,
        tools=(LIGHT,),
        max_tokens=128,
        temperature=0.2,
        top_p=0.9,
        seed=7,
        stop=("\n\n", "User:"),
        assistant_prefix="The kitchen light",
        priority=1,
        options={"top_k": 40, "tool_choice": "auto"},
    ),
    ChatRequest(
        model="m",
        messages=CONVERSATION[:2],
        json_schema={"type": "object", "properties": {"on": {"type": "boolean"}}},
    ),
    ChatRequest(model="m", messages=CONVERSATION[:2], json_mode=True),
]


def decode(request: ChatRequest, data: bytes) -> list[StreamChunk]:
    """Feed a whole SSE body to the client's decoder, as the backend does line by line."""
    decoder = openai.StreamDecoder(request, "http://server")
    chunks: list[StreamChunk] = []
    for line in data.split(b"\n"):
        if line.strip():
            chunks += decoder.feed(line.strip())
        if decoder.done:
            return chunks
    return [*chunks, decoder.end()]


@pytest.mark.parametrize("request_", REQUESTS)
def test_request_round_trip(request_: ChatRequest) -> None:
    """A request written as a client body and read back by the server side is the same."""
    fields = {"priority": request_.priority} if request_.priority is not None else {}
    body = openai.chat_body(request_, fields)
    parsed = openai.parse_chat(json.loads(json.dumps(body)))
    assert parsed.request == request_
    assert (parsed.stream, parsed.include_usage) == (True, True)


def test_body_puts_the_resume_prefix_last_and_options_over_server_fields() -> None:
    """The prefix is the final assistant message; the request's options win over server fields."""
    request = replace(REQUESTS[1], options={"priority": 9})
    body = openai.chat_body(request, {"priority": 1, "continue_final_message": True})
    assert body["messages"][-1] == {"role": "assistant", "content": "The kitchen light"}
    assert body["priority"] == 9
    assert body["continue_final_message"] is True
    assert body["messages"][2]["tool_calls"][0] == {
        "id": "call_a1",
        "type": "function",
        "function": {"name": "HassTurnOn", "arguments": '{"name": "Kitchen light"}'},
    }


CHUNKS = [
    StreamChunk(text="The", output_tokens=1),
    StreamChunk(text=" light", output_tokens=1),
    StreamChunk(text=" is on.", output_tokens=1),
    StreamChunk(tool_calls=(CALL,)),
    StreamChunk(
        done=True, finish_reason="tool_calls", usage=TokenUsage(42, 9, "server")
    ),
]


def test_stream_round_trip() -> None:
    """Chunks written as SSE events and read back give the same text, tool calls and usage."""
    encoder = openai.StreamEncoder(
        model="m", completion_id="chatcmpl-1", created=1700000000, include_usage=True
    )
    data = b"".join(encoder.sse(chunk) for chunk in CHUNKS)
    assert data.endswith(openai.SSE_DONE)
    chunks = decode(REQUESTS[0], data)
    assert Answer.of(chunks) == Answer.of(CHUNKS)
    assert [chunk.text for chunk in chunks if chunk.text] == [
        "The",
        " light",
        " is on.",
    ]
    assert sum(chunk.output_tokens for chunk in chunks) == 3


def test_stream_without_usage_event_is_estimated_like_admission() -> None:
    """Without include_usage the client estimates the prompt as the scheduler's admission does."""
    encoder = openai.StreamEncoder(model="m", completion_id="c", created=0)
    data = b"".join(encoder.sse(chunk) for chunk in CHUNKS)
    request = ChatRequest(model="m", messages=())
    usage = decode(request, data)[-1].usage
    # Three text deltas and one tool-call delta, each counted as a token.
    assert usage == TokenUsage(estimate_prompt_tokens(request), 4, "estimate")
    assert usage.prompt_tokens == 1  # never 0: the same floor as admission


def test_stream_events_and_the_whole_completion() -> None:
    """The first event names the role; a non-streaming client gets one chat.completion."""
    encoder = openai.StreamEncoder(
        model="m", completion_id="chatcmpl-1", created=1700000000, include_usage=True
    )
    events = [event for chunk in CHUNKS for event in encoder.feed(chunk)]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {event["object"] for event in events} == {"chat.completion.chunk"}
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {
        "prompt_tokens": 42,
        "completion_tokens": 9,
        "total_tokens": 51,
    }
    completion = encoder.completion()
    assert completion["object"] == "chat.completion"
    assert completion["id"] == "chatcmpl-1"
    (choice,) = completion["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "The light is on."
    assert choice["message"]["tool_calls"] == [openai.tool_call_to_wire(CALL)]
    assert completion["usage"]["total_tokens"] == 51


def test_resume_echo_is_dropped_by_the_decoder() -> None:
    """A server that streams the resume prefix back first: only the new text reaches the caller."""
    request = replace(REQUESTS[0], assistant_prefix="Once upon")
    encoder = openai.StreamEncoder(model="m", completion_id="c", created=0)
    pieces = ["Once", " upon", " a", " time"]
    data = b"".join(
        encoder.sse(StreamChunk(text=piece, output_tokens=1)) for piece in pieces
    ) + encoder.sse(StreamChunk(done=True, finish_reason="stop"))
    chunks = decode(request, data)
    assert "".join(chunk.text for chunk in chunks) == " a time"


def test_parse_a_typical_client_request() -> None:
    """What clients send beyond our own bodies: text parts, developer role, one stop string."""
    parsed = openai.parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Hello "},
                        {"type": "text", "text": "there"},
                    ],
                },
            ],
            "max_tokens": 50,
            "max_completion_tokens": 20,
            "stop": "END",
            "response_format": {"type": "json_object"},
            "user": "someone",
        }
    )
    request = parsed.request
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "Hello there"),
    ]
    assert request.max_tokens == 20
    assert request.stop == ("END",)
    assert request.json_mode and request.json_schema is None
    assert request.options == {"user": "someone"}
    assert (parsed.stream, parsed.include_usage) == (False, False)


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    }
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "request"),
        ({"model": "m"}, "messages"),
        (_body(messages=[]), "messages"),
        (_body(model=3), "model"),
        (_body(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
        (
            _body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            "messages[0].content[0].type",
        ),
        (
            _body(
                messages=[
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "1", "function": {"name": "f", "arguments": "{x"}}
                        ],
                    },
                ]
            ),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (_body(tools=[{"type": "retrieval"}]), "tools[0].type"),
        (_body(tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
        (_body(max_tokens=0), "max_tokens"),
        (_body(max_completion_tokens="many"), "max_completion_tokens"),
        (_body(temperature="warm"), "temperature"),
        (_body(seed=1.5), "seed"),
        (_body(stop=[1]), "stop"),
        (_body(n=2), "n"),
        (_body(stream="yes"), "stream"),
        (_body(stream_options={"include_usage": 1}), "stream_options.include_usage"),
        (_body(response_format={"type": "xml"}), "response_format.type"),
        (
            _body(response_format={"type": "json_schema", "json_schema": {}}),
            "response_format.json_schema.schema",
        ),
    ],
)
def test_parse_errors_name_the_field(body: Any, field: str) -> None:
    """A malformed request raises one typed error that names the bad field."""
    with pytest.raises(InvalidRequestError) as caught:
        openai.parse_chat(body)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert caught.value.placeholders["field"] == field
