"""The Ollama wire format beyond the round trips: its own fields, lines and errors."""

from __future__ import annotations

from dataclasses import replace
import json
from typing import Any

import pytest

from custom_components.llm_lanes.core.errors import InvalidRequestError
from custom_components.llm_lanes.core.model import StreamChunk, ToolCall
from custom_components.llm_lanes.core.protocols import (
    ollama_answers,
    ollama_requests,
    openai_requests,
)
from tests.core.fakes import FakeClock

from .samples import CHUNKS, REQUESTS


def test_keep_alive_and_think_travel_at_the_top_level() -> None:
    """They are options of ours, top-level fields of Ollama's; the request's keep_alive wins."""
    request = replace(REQUESTS[0], options={"think": False, "keep_alive": "5m", "k": 1})
    body = ollama_requests.chat_body(request, keep_alive=-1)
    assert (body["keep_alive"], body["think"], body["options"]) == (
        "5m",
        False,
        {"k": 1},
    )
    assert ollama_requests.parse_chat(body).request == request
    assert ollama_requests.chat_body(REQUESTS[0], keep_alive=-1)["keep_alive"] == -1
    assert "keep_alive" not in ollama_requests.chat_body(REQUESTS[0], keep_alive=None)
    assert ollama_requests.chat_body(REQUESTS[3], keep_alive=None)["format"] == "json"


def test_an_openai_request_reaches_ollama_with_its_options() -> None:
    """A gateway client's extra OpenAI fields go into Ollama's options."""
    parsed = openai_requests.parse_chat(
        {
            "model": "llama3.2",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 10,
            "top_k": 20,
        }
    )
    body = ollama_requests.chat_body(parsed.request, keep_alive=None)
    assert body["options"] == {"num_predict": 10, "top_k": 20}


def test_final_line_has_counts_and_durations() -> None:
    """Prompt evaluation lasts until the first token, evaluation from there to the end."""
    clock = FakeClock(100.0)
    encoder = ollama_answers.StreamEncoder(
        model="llama3.2", clock=clock, wall_clock=lambda: 0
    )
    lines: list[dict[str, Any]] = []
    for chunk in CHUNKS:
        clock.advance(0.25)
        lines += encoder.feed(chunk)
    final = lines[-1]
    assert [line["done"] for line in lines] == [False] * 4 + [True]
    assert final["created_at"] == "1970-01-01T00:00:00Z"
    assert final["done_reason"] == "stop"  # Ollama says stop after tool calls too
    assert (final["prompt_eval_count"], final["eval_count"]) == (26, 12)
    assert final["prompt_eval_duration"] == 250_000_000
    assert final["eval_duration"] == 1_000_000_000
    assert final["total_duration"] == 1_250_000_000


def test_length_and_unknown_counts() -> None:
    """A cut answer says length; without usage the output is counted from the chunks."""
    encoder = ollama_answers.StreamEncoder(
        model="m", clock=FakeClock(), wall_clock=lambda: 0
    )
    lines = encoder.feed(StreamChunk(text="a", output_tokens=1))
    lines += encoder.feed(StreamChunk(done=True, finish_reason="length"))
    assert (lines[-1]["done_reason"], lines[-1]["eval_count"]) == ("length", 1)
    assert "prompt_eval_count" not in lines[-1]
    assert (
        json.loads(encoder.encode(StreamChunk(text="b")))["message"]["content"] == "b"
    )


def test_parse_a_typical_client_request() -> None:
    """num_predict -1 sets no limit; a one-word stop is a list of one; stream defaults on."""
    parsed = ollama_requests.parse_chat(
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
    assert (request.max_tokens, request.stop, request.assistant_prefix) == (
        None,
        ("END",),
        "",
    )
    assert request.messages[1].tool_calls == (
        ToolCall(id="call_0", name="f", arguments={"a": 1}),
    )
    assert parsed.stream is True


def test_empty_conversation_loads_the_model() -> None:
    """Ollama's load request (no messages) is valid."""
    parsed = ollama_requests.parse_chat({"model": "m", "messages": [], "stream": False})
    assert (parsed.request.messages, parsed.stream) == ((), False)


def _body(**changes: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "x"}], **changes}


LIST_ARGUMENTS = {
    "role": "assistant",
    "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
}


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
            _body(messages=[LIST_ARGUMENTS]),
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
        ollama_requests.parse_chat(body)
    assert caught.value.field == field
