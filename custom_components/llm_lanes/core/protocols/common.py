"""What the OpenAI and Ollama wire formats share.

The decoder and encoder interfaces, what a parsed request holds, estimated usage, the resume
prefix (split off a request, its echo dropped from a stream), sampling settings, function tools,
tool call arguments, the options of a client's request that may reach the server, and the chunks
of an embeddings answer. Reading a request field by field is ``fields``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
import json
from typing import Any, Protocol

from custom_components.llm_lanes.core.errors import (
    MalformedStreamError,
    StreamClosedError,
)
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    StreamChunk,
    TokenUsage,
    ToolSpec,
)
from custom_components.llm_lanes.core.tokens import (
    estimate_prompt_tokens,
    estimate_text_tokens,
)


@dataclass(frozen=True, slots=True)
class ParsedChat:
    """A chat request a client sent, and how it wants the answer delivered."""

    request: ChatRequest
    stream: bool
    """Stream the answer (SSE / NDJSON) rather than send one object at the end."""
    include_usage: bool = False
    """OpenAI ``stream_options.include_usage``: end the stream with a usage event."""
    load_only: bool = False
    """Ollama's empty chat or prompt: load the model and answer at once, nothing to generate."""


@dataclass(frozen=True, slots=True)
class ParsedEmbeddings:
    """An embeddings request a client sent."""

    request: EmbeddingRequest
    base64: bool = False
    """OpenAI ``encoding_format: base64``: each vector as little-endian float32, base64."""


class StreamDecoder(Protocol):
    """What the client side of each format offers for reading a streamed answer."""

    @property
    def started(self) -> bool:
        """Whether the answer has begun (its first token or tool call came)."""

    @property
    def done(self) -> bool:
        """Whether the last chunk has been given (the stream said it was done)."""

    def feed(self, line: bytes) -> list[StreamChunk]:
        """Decode one line of the stream into the chunks it carries."""

    def end(self) -> StreamChunk:
        """Return the final chunk when the body ends before ``done`` (or raise)."""


class StreamEncoder(Protocol):
    """What the server side of each format offers for writing an answer."""

    def feed(self, chunk: StreamChunk) -> list[dict[str, Any]]:
        """Return the objects (events, lines) that carry ``chunk`` on the wire."""

    def encode(self, chunk: StreamChunk) -> bytes:
        """Return the bytes that carry ``chunk`` on the wire."""

    def answer(self) -> dict[str, Any]:
        """Return the whole answer fed so far as one object (for a client that did not stream)."""


def estimated_prompt(request: ChatRequest) -> int:
    """Estimate the prompt tokens of a chat, a raw completion or an embeddings request.

    A chat is estimated as the scheduler's admission estimates it.
    """
    if isinstance(request, CompletionRequest):
        return max(1, estimate_text_tokens(request.prompt + request.assistant_prefix))
    if isinstance(request, EmbeddingRequest):
        return max(1, sum(estimate_text_tokens(text) for text in request.inputs))
    return estimate_prompt_tokens(request)


def estimated_usage(request: ChatRequest, output_tokens: int) -> TokenUsage:
    """Return the usage of an answer whose server gave no counts.

    The prompt is estimated (``estimated_prompt``); the output is what streamed.
    """
    return TokenUsage(estimated_prompt(request), output_tokens, "estimate")


def embedding_chunks(
    request: EmbeddingRequest, vectors: Sequence[Sequence[float]], prompt_tokens: Any
) -> list[StreamChunk]:
    """Return the answer to an embeddings request: the vectors, then the final chunk.

    ``prompt_tokens`` is the server's count (estimated when it is not a whole number). The
    vectors' chunk counts as one output token so the request has a first token; the final
    chunk's usage (no output) corrects that.
    """
    if len(vectors) != len(request.inputs):
        raise MalformedStreamError(
            f"the server sent {len(vectors)} embeddings for {len(request.inputs)} inputs"
        )
    usage = (
        TokenUsage(prompt_tokens, 0, "server")
        if isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool)
        else estimated_usage(request, 0)
    )
    return [
        StreamChunk(output_tokens=1, embeddings=tuple(vectors)),
        StreamChunk(done=True, finish_reason="stop", usage=usage),
    ]


def vectors_of(items: Iterable[Any], what: str) -> list[list[float]]:
    """Check that a server's embeddings are lists of numbers (``what`` names them in errors)."""
    vectors: list[list[float]] = []
    for item in items:
        if not isinstance(item, list) or not all(
            isinstance(value, int | float) for value in item
        ):
            raise MalformedStreamError(f"{what} holds a vector that is not numbers")
        vectors.append(item)
    return vectors


SERVER_OPTIONS = frozenset({
    "keep_alive", "num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap",
    "use_mlock", "low_vram", "numa", "vocab_only",
})  # fmt: skip
"""Ollama options that (re)load or unload the model: the server's owner sets them, not a client.

One client asking for another context size would make Ollama reload the model for everyone, and
``keep_alive: 0`` would unload it after every request, so they never pass the gateway.
"""
PORTABLE_OPTIONS = frozenset({
    "top_k", "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
    "frequency_penalty", "mirostat", "mirostat_tau", "mirostat_eta", "dimensions",
})  # fmt: skip
"""Options that Ollama (in ``options``) and llama.cpp (at the top level) both take: sampling
settings, and the size of embeddings."""


def client_options(options: Mapping[str, Any], *, same_format: bool) -> dict[str, Any]:
    """Return the options of a client's request that may reach the server.

    Between the same formats everything passes but what belongs to the server's owner
    (``SERVER_OPTIONS``); across formats only the options both know.
    """
    return {
        key: value
        for key, value in options.items()
        if key not in SERVER_OPTIONS and (same_format or key in PORTABLE_OPTIONS)
    }


def stream_closed(url: str) -> StreamClosedError:
    """Return the error of a stream that ended before the server said it was done."""
    return StreamClosedError(f"{url} closed the stream before it was done", url=url)


class PrefixEcho:
    """Drops a server's echo of the resume prefix from the start of a streamed answer.

    While the stream may still be echoing the prefix, deltas are held back; an exact echo is
    dropped, anything else is released as it came.
    """

    __slots__ = ("_echo", "_held", "held_tokens")

    def __init__(self, prefix: str) -> None:
        """Watch for ``prefix`` ("" watches for nothing)."""
        self._echo: str | None = prefix or None
        self._held = ""
        self.held_tokens = 0

    def text(self, delta: str) -> tuple[str, int]:
        """Return the text of a delta (one token) the caller should see, and its token count."""
        if self._echo is None:
            return delta, 1
        self._held += delta
        self.held_tokens += 1
        if self._held.startswith(self._echo):
            rest = self._held[len(self._echo) :]
            self._echo = None
            return rest, 1 if rest else 0
        if self._echo.startswith(self._held):
            return "", 0
        self._echo = None
        return self._held, self.held_tokens


def sampling_to_wire(request: ChatRequest, max_tokens_key: str) -> dict[str, Any]:
    """Write the sampling settings a request sets (both formats name all but max_tokens alike)."""
    values = {
        max_tokens_key: request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "stop": list(request.stop) or None,
    }
    return {key: value for key, value in values.items() if value is not None}


def stream_object(text: str, url: str, what: str) -> dict[str, Any]:
    """Decode one JSON object a server streamed (``what``: "an event", "a line")."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise MalformedStreamError(
            f"{url} sent {what} that is not JSON: {text[:80]!r}", url=url
        ) from err
    if not isinstance(data, dict):
        raise MalformedStreamError(
            f"{url} sent {what} that is not an object: {text[:80]!r}", url=url
        )
    return data


def tools_to_wire(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Offer tools as function tools (the same shape in both formats)."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


def json_object(arguments: Any) -> dict[str, Any] | None:
    """Return tool call arguments as an object: given as one, or as JSON text ("" is {})."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments.strip() or "{}")
        except ValueError:
            return None
    return arguments if isinstance(arguments, dict) else None


def split_prefix(
    messages: Sequence[ChatMessage],
) -> tuple[tuple[ChatMessage, ...], str]:
    """Split off a final assistant message: the beginning of the answer, to be continued.

    That is how both formats resume an answer (``ChatRequest.assistant_prefix``).
    """
    last = messages[-1] if len(messages) > 1 else None
    if last is not None and last.role == "assistant" and not last.tool_calls:
        return tuple(messages[:-1]), last.content
    return tuple(messages), ""
