"""Both wire formats: a request or a stream turned into the format and read back is the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
import json
from typing import Any

import pytest

from custom_components.llm_lanes.core.model import Answer, ChatRequest
from custom_components.llm_lanes.core.protocols import (
    ollama_answers,
    ollama_requests,
    openai_answers,
    openai_requests,
)
from custom_components.llm_lanes.core.protocols.common import (
    ParsedChat,
    StreamDecoder,
    StreamEncoder,
)
from tests.core.fakes import FakeClock

from .samples import CHUNKS, REQUESTS, read_back


@dataclass(frozen=True, slots=True)
class WireFormat:
    """Both sides of one format, as the round trips use them."""

    body: Callable[[ChatRequest], dict[str, Any]]
    """The backend's body of a request."""
    parse: Callable[[Any], ParsedChat]
    """The gateway's reading of a client's body."""
    decoder: Callable[[ChatRequest, str], StreamDecoder]
    """The backend's reader of a stream."""
    encoder: Callable[[], StreamEncoder]
    """The gateway's writer of an answer."""


FORMATS = {
    "openai": WireFormat(
        body=openai_requests.chat_body,
        parse=openai_requests.parse_chat,
        decoder=openai_answers.StreamDecoder,
        encoder=lambda: openai_answers.StreamEncoder(
            model="m", completion_id="chatcmpl-1", created=0, include_usage=True
        ),
    ),
    "ollama": WireFormat(
        # Without a keep_alive of the backend's own.
        body=lambda request: ollama_requests.chat_body(request, keep_alive=None),
        parse=ollama_requests.parse_chat,
        decoder=ollama_answers.StreamDecoder,
        encoder=lambda: ollama_answers.StreamEncoder(
            model="m", clock=FakeClock(), wall_clock=lambda: 0
        ),
    ),
}


@pytest.fixture(params=list(FORMATS))
def wire(request: pytest.FixtureRequest) -> WireFormat:
    """Each format in turn."""
    return FORMATS[request.param]


@pytest.mark.parametrize("request_", REQUESTS)
def test_request_round_trip(wire: WireFormat, request_: ChatRequest) -> None:
    """A request written as the backend's body and parsed by the server side is the same."""
    parsed = wire.parse(json.loads(json.dumps(wire.body(request_))))
    assert parsed.request == request_
    assert parsed.stream is True


def test_stream_round_trip(wire: WireFormat) -> None:
    """Chunks written by the server side and read by the client give the same answer."""
    writer = wire.encoder()
    data = b"".join(writer.encode(chunk) for chunk in CHUNKS)
    chunks = read_back(wire.decoder(REQUESTS[0], "http://server"), data)
    # Ollama's prompt count is what it evaluated: the decoder says so, the rest is the same.
    decoded = Answer.of(chunks)
    assert decoded.usage is not None
    assert replace(
        decoded, usage=replace(decoded.usage, evaluated_prompt_tokens=None)
    ) == Answer.of(CHUNKS)
    assert [chunk.text for chunk in chunks if chunk.text] == ["It", " is", " sunny."]


def test_whole_answer_holds_the_stream(wire: WireFormat) -> None:
    """A client that does not stream gets every piece in one object."""
    writer = wire.encoder()
    for chunk in CHUNKS:
        writer.feed(chunk)
    answer = writer.answer()
    text = json.dumps(answer)
    assert "It is sunny." in text
    assert text.count("get_weather") == 2
    assert "Lyon" in text
