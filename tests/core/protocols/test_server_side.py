"""The server side of both wire formats beyond chat: raw completions, generate, embeddings.

Also the options a client may pass to a server (``common.client_options``).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from custom_components.llm_lanes.core.errors import (
    InvalidRequestError,
    MalformedStreamError,
)
from custom_components.llm_lanes.core.model import (
    CompletionRequest,
    EmbeddingRequest,
    StreamChunk,
    TokenUsage,
)
from custom_components.llm_lanes.core.protocols import (
    ollama_answers,
    ollama_requests,
    openai_answers,
    openai_requests,
)
from custom_components.llm_lanes.core.protocols.common import (
    client_options,
    embedding_chunks,
    estimated_prompt,
)


def test_completion_request_is_read_and_refusals_name_the_field() -> None:
    """One prompt, OpenAI sampling fields; what cannot be served is refused by name."""
    parsed = openai_requests.parse_completion(
        {"model": "m", "prompt": ["Once"], "max_tokens": 5, "stream": True, "user": "u"}
    )
    assert parsed.request == CompletionRequest(
        model="m", messages=(), prompt="Once", max_tokens=5, options={"user": "u"}
    )
    assert parsed.stream
    for body, field in (
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "suffix": "b"}, "suffix"),
        ({"prompt": "a", "best_of": 2}, "best_of"),
        ({"prompt": [1, 2]}, "prompt"),
    ):
        with pytest.raises(InvalidRequestError) as err:
            openai_requests.parse_completion({"model": "m", **body})
        assert err.value.field == field


def test_embeddings_request() -> None:
    """Text inputs only; floats or base64."""
    parsed = openai_requests.parse_embeddings(
        {"model": "m", "input": "hi", "encoding_format": "base64", "dimensions": 4}
    )
    assert parsed.request == EmbeddingRequest(
        model="m", messages=(), inputs=("hi",), options={"dimensions": 4}
    )
    assert parsed.base64
    for body, field in (({"input": [[1, 2]]}, "input"), ({"input": []}, "input")):
        with pytest.raises(InvalidRequestError) as err:
            openai_requests.parse_embeddings({"model": "m", **body})
        assert err.value.field == field
    with pytest.raises(InvalidRequestError, match="encoding_format"):
        openai_requests.parse_embeddings(
            {"model": "m", "input": "x", "encoding_format": "int8"}
        )
    ollama_parsed = ollama_requests.parse_embed(
        {"model": "m", "input": ["a", "b"], "truncate": False, "keep_alive": "5m"}
    )
    assert ollama_parsed.request.inputs == ("a", "b")
    assert ollama_parsed.request.options == {"truncate": False, "keep_alive": "5m"}


def test_base64_embeddings_are_little_endian_float32() -> None:
    """The packed vectors decode back to the floats (as the openai package decodes them)."""
    wire = openai_answers.embeddings_to_wire(
        [(0.5, -1.25)], TokenUsage(3, 0, "server"), model="m", base64_vectors=True
    )
    packed = base64.b64decode(wire["data"][0]["embedding"])
    assert struct.unpack("<2f", packed) == (0.5, -1.25)
    assert wire["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_generate_is_a_chat_of_one_turn_or_a_raw_completion() -> None:
    """``system`` and ``prompt`` make a turn; ``raw`` a completion; an empty prompt only loads."""
    templated = ollama_requests.parse_generate(
        {
            "model": "m",
            "prompt": "Hi",
            "system": "Be brief",
            "options": {"num_predict": 3},
        }
    )
    assert [(m.role, m.content) for m in templated.request.messages] == [
        ("system", "Be brief"),
        ("user", "Hi"),
    ]
    assert templated.request.max_tokens == 3
    assert not templated.load_only
    raw = ollama_requests.parse_generate({"model": "m", "prompt": "Once", "raw": True})
    assert isinstance(raw.request, CompletionRequest)
    assert raw.request.prompt == "Once"
    assert ollama_requests.parse_generate({"model": "m"}).load_only
    assert ollama_requests.parse_chat({"model": "m", "messages": []}).load_only
    for field in ("suffix", "template", "context", "images"):
        value: Any = [1] if field in {"context", "images"} else "x"
        with pytest.raises(InvalidRequestError) as err:
            ollama_requests.parse_generate({"model": "m", "prompt": "p", field: value})
        assert err.value.field == field


def test_completion_and_generate_encoders() -> None:
    """``text_completion`` events (usage at the end when asked); generate lines in ``response``."""
    encoder = openai_answers.CompletionEncoder(
        model="m", completion_id="c", created=0, include_usage=True
    )
    chunks = [
        StreamChunk(text="Once", output_tokens=1),
        StreamChunk(
            done=True, finish_reason="length", usage=TokenUsage(2, 1, "server")
        ),
    ]
    events = [event for chunk in chunks for event in encoder.feed(chunk)]
    assert [e["choices"][0]["text"] for e in events[:2]] == ["Once", ""]
    assert events[1]["choices"][0]["finish_reason"] == "length"
    assert events[2]["choices"] == []
    assert events[2]["usage"]["completion_tokens"] == 1
    assert encoder.encode(StreamChunk(done=True)).endswith(openai_answers.SSE_DONE)
    assert encoder.answer()["choices"][0]["text"] == "Once"

    lines = ollama_answers.StreamEncoder(model="m", generate=True)
    sent = [line for chunk in chunks for line in lines.feed(chunk)]
    assert [line["response"] for line in sent] == ["Once", ""]
    assert "message" not in sent[0]
    assert sent[-1]["done_reason"] == "length"
    loading = ollama_answers.StreamEncoder(model="m")
    loading.feed(StreamChunk(done=True, finish_reason="load"))
    assert loading.answer()["done_reason"] == "load"


def test_embedding_answers_and_estimates() -> None:
    """The vectors' chunk counts as the first token; the usage has no output; counts must match."""
    request = EmbeddingRequest(model="m", messages=(), inputs=("abcd", "efgh"))
    first, final = embedding_chunks(request, [[1.0], [2.0]], 7)
    assert first.embeddings == ([1.0], [2.0]) and first.output_tokens == 1
    assert final.done and final.usage == TokenUsage(7, 0, "server")
    assert embedding_chunks(request, [[1.0], [2.0]], None)[1].usage == TokenUsage(
        2, 0, "estimate"
    )
    with pytest.raises(MalformedStreamError):
        embedding_chunks(request, [[1.0]], 7)
    assert (
        estimated_prompt(
            CompletionRequest(
                model="m", messages=(), prompt="abcdefgh", assistant_prefix="ij"
            )
        )
        == 3
    )


def test_client_options() -> None:
    """The server's own options never pass; across formats only the shared ones do."""
    options = {
        "keep_alive": 0,
        "num_ctx": 8192,
        "top_k": 20,
        "think": True,
        "user": "u",
    }
    assert client_options(options, same_format=True) == {
        "top_k": 20,
        "think": True,
        "user": "u",
    }
    assert client_options(options, same_format=False) == {"top_k": 20}
