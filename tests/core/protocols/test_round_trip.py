"""Both wire formats: a request or a stream turned into the format and read back is the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
import json
from types import ModuleType
from typing import Any

import pytest

from custom_components.llm_lanes.core.backends.base import Answer, ChatRequest
from custom_components.llm_lanes.core.protocols import ollama, openai
from custom_components.llm_lanes.core.protocols.common import StreamEncoder
from tests.core.fakes import FakeClock

from .samples import CHUNKS, REQUESTS, read_back


def openai_body(request: ChatRequest) -> dict[str, Any]:
    """Build the OpenAI backend's body."""
    return openai.chat_body(request)


def ollama_body(request: ChatRequest) -> dict[str, Any]:
    """Build the Ollama backend's body, without a keep_alive of its own."""
    return ollama.chat_body(request, keep_alive=None)


def openai_encoder() -> StreamEncoder:
    """Make the gateway's OpenAI writer, usage included."""
    return openai.StreamEncoder(
        model="m", completion_id="chatcmpl-1", created=0, include_usage=True
    )


def ollama_encoder() -> StreamEncoder:
    """Make the gateway's Ollama writer."""
    return ollama.StreamEncoder(model="m", clock=FakeClock(), wall_clock=lambda: 0)


PROTOCOLS = pytest.mark.parametrize(
    ("protocol", "body", "encoder"),
    [(openai, openai_body, openai_encoder), (ollama, ollama_body, ollama_encoder)],
    ids=["openai", "ollama"],
)


@PROTOCOLS
@pytest.mark.parametrize("request_", REQUESTS)
def test_request_round_trip(
    protocol: ModuleType,
    body: Callable[[ChatRequest], dict[str, Any]],
    encoder: Callable[[], StreamEncoder],
    request_: ChatRequest,
) -> None:
    """A request written as the backend's body and parsed by the server side is the same."""
    parsed = protocol.parse_chat(json.loads(json.dumps(body(request_))))
    assert parsed.request == request_
    assert parsed.stream is True


@PROTOCOLS
def test_stream_round_trip(
    protocol: ModuleType,
    body: Callable[[ChatRequest], dict[str, Any]],
    encoder: Callable[[], StreamEncoder],
) -> None:
    """Chunks written by the server side and read by the client give the same answer."""
    writer = encoder()
    data = b"".join(writer.encode(chunk) for chunk in CHUNKS)
    chunks = read_back(protocol.StreamDecoder(REQUESTS[0], "http://server"), data)
    # Ollama's prompt count is what it evaluated: the decoder says so, the rest is the same.
    decoded = Answer.of(chunks)
    assert decoded.usage is not None
    assert replace(
        decoded, usage=replace(decoded.usage, evaluated_prompt_tokens=None)
    ) == Answer.of(CHUNKS)
    assert [chunk.text for chunk in chunks if chunk.text] == ["It", " is", " sunny."]


@PROTOCOLS
def test_whole_answer_holds_the_stream(
    protocol: ModuleType,
    body: Callable[[ChatRequest], dict[str, Any]],
    encoder: Callable[[], StreamEncoder],
) -> None:
    """A client that does not stream gets every piece in one object."""
    writer = encoder()
    for chunk in CHUNKS:
        writer.feed(chunk)
    answer = writer.answer()
    text = json.dumps(answer)
    assert "It is sunny." in text
    assert text.count("get_weather") == 2
    assert "Lyon" in text
