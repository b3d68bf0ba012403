"""The OpenAI wire format beyond the round trips: its own fields, events and errors."""

from __future__ import annotations

from dataclasses import replace
import json
from typing import Any

import pytest

from custom_components.llm_lanes.core.errors import InvalidRequestError
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    TokenUsage,
)
from custom_components.llm_lanes.core.protocols import openai_answers, openai_requests
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens

from .samples import CALLS, CHUNKS, REQUESTS, read_back

HELLO = REQUESTS[0]


def decoder(request: ChatRequest = HELLO) -> openai_answers.StreamDecoder:
    """Make the client's decoder of an answer to ``request``."""
    return openai_answers.StreamDecoder(request, "http://server")


def test_ids_and_priority_survive_the_round_trip() -> None:
    """OpenAI carries what Ollama cannot: tool call ids, tool results' ids, a priority."""
    request = replace(
        REQUESTS[1],
        messages=(
            ChatMessage(role="assistant", tool_calls=(replace(CALLS[0], id="x7"),)),
            ChatMessage(role="tool", content="22 C", tool_call_id="x7", name="w"),
        ),
        priority=1,
    )
    body = openai_requests.chat_body(request, {"priority": 1})
    assert openai_requests.parse_chat(json.loads(json.dumps(body))).request == request


def test_request_options_win_over_server_fields() -> None:
    """The prefix is the final assistant message; options override what the server kind adds."""
    request = replace(REQUESTS[1], options={"priority": 9})
    body = openai_requests.chat_body(
        request, {"priority": 1, "continue_final_message": True}
    )
    assert body["messages"][-1] == {"role": "assistant", "content": "Paris is"}
    assert (body["priority"], body["continue_final_message"]) == (9, True)
    assert body["stream_options"] == {"include_usage": True}


def test_events_name_the_role_first_and_end_with_usage() -> None:
    """chat.completion.chunk events: role first, finish reason, then a usage-only event."""
    encoder = openai_answers.StreamEncoder(
        model="m", completion_id="chatcmpl-1", created=1700000000, include_usage=True
    )
    events = [event for chunk in CHUNKS for event in encoder.feed(chunk)]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {event["object"] for event in events} == {"chat.completion.chunk"}
    assert {event["id"] for event in events} == {"chatcmpl-1"}
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert (events[-1]["choices"], events[-1]["usage"]["total_tokens"]) == ([], 38)
    answer = encoder.answer()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["tool_calls"] == [
        openai_requests.tool_call_to_wire(call) for call in CALLS
    ]
    assert answer["usage"] == {
        "prompt_tokens": 26,
        "completion_tokens": 12,
        "total_tokens": 38,
    }


def test_without_usage_the_client_estimates_like_admission() -> None:
    """No usage event: the prompt is estimated as the scheduler's admission estimates it."""
    encoder = openai_answers.StreamEncoder(model="m", completion_id="c", created=0)
    data = b"".join(encoder.encode(chunk) for chunk in CHUNKS)
    assert data.endswith(openai_answers.SSE_DONE)
    empty = ChatRequest(model="m", messages=())
    usage = read_back(decoder(empty), data)[-1].usage
    # Three text deltas and one tool-call delta, each counted as a token.
    assert usage == TokenUsage(estimate_prompt_tokens(empty), 4, "estimate")
    assert usage.prompt_tokens == 1  # never 0: the same floor as admission


def test_resume_echo_is_dropped() -> None:
    """A server that streams the resume prefix back first: only the new text reaches the caller."""
    encoder = openai_answers.StreamEncoder(model="m", completion_id="c", created=0)
    pieces = [StreamChunk(text=t, output_tokens=1) for t in ("Once", " upon", " a")]
    data = b"".join(encoder.encode(chunk) for chunk in pieces)
    data += encoder.encode(StreamChunk(done=True, finish_reason="stop"))
    chunks = read_back(decoder(replace(HELLO, assistant_prefix="Once upon")), data)
    assert "".join(chunk.text for chunk in chunks) == " a"


def test_parse_a_typical_client_request() -> None:
    """What clients send beyond our own bodies: text parts, developer role, one stop string."""
    parsed = openai_requests.parse_chat(
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
    assert (request.max_tokens, request.stop) == (20, ("END",))
    assert request.json_mode and request.json_schema is None
    assert request.options == {"user": "someone"}
    assert (parsed.stream, parsed.include_usage) == (False, False)


def _body(**changes: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **changes}


ASSISTANT_CALL = {
    "role": "assistant",
    "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{x"}}],
}


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
            _body(messages=[{"role": "user", "content": "x"}, ASSISTANT_CALL]),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (_body(tools=[{"type": "retrieval"}]), "tools[0].type"),
        (_body(tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
        (_body(max_tokens=0), "max_tokens"),
        (_body(max_tokens=9, max_completion_tokens=0), "max_completion_tokens"),
        (_body(max_completion_tokens="many"), "max_completion_tokens"),
        (_body(temperature="warm"), "temperature"),
        (_body(seed=1.5), "seed"),
        (_body(stop=[1]), "stop"),
        (_body(n=2), "n"),
        (_body(stream="yes"), "stream"),
        (_body(stream_options=[]), "stream_options"),
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
        openai_requests.parse_chat(body)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert caught.value.placeholders["field"] == field
