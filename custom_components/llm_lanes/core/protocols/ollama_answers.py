"""Ollama's answers, both directions.

The backend reads a server's: ``StreamDecoder`` turns the NDJSON lines of a chat or generate
stream into ``StreamChunk`` s: a line with text is one token, tool calls come whole (arguments
as objects), the final line's counts are the usage (estimated where the server leaves them
out), and an error line raises the typed error it stands for; ``embed_answer`` reads
embeddings. The gateway writes its own: ``StreamEncoder`` the NDJSON lines of a chat or generate
stream, ending with the counts and durations, and the single object of a whole answer;
``embed_to_wire``, ``tags_to_wire``, ``show_to_wire``, ``ps_to_wire`` (the documents that
describe the models) and ``error_body`` the other answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
import json
import time
from typing import Any

from custom_components.llm_lanes.core.errors import (
    BackendError,
    MalformedStreamError,
    http_error,
)
from custom_components.llm_lanes.core.model import (
    Answer,
    ChatRequest,
    EmbeddingRequest,
    StreamChunk,
    TokenUsage,
    ToolCall,
)
from custom_components.llm_lanes.core.protocols.common import (
    embedding_chunks,
    estimated_usage,
    json_object,
    stream_closed,
    stream_object,
    vectors_of,
)
from custom_components.llm_lanes.core.protocols.ollama_requests import tool_call_to_wire

# --- read by the backend -----------------------------------------------------------------------


def embed_answer(data: Any, request: EmbeddingRequest, url: str) -> list[StreamChunk]:
    """Read an ``/api/embed`` answer as the chunks of ``common.embedding_chunks``."""
    embeddings = data.get("embeddings") if isinstance(data, dict) else None
    if not isinstance(embeddings, list):
        raise MalformedStreamError(f"{url} answered without embeddings", url=url)
    vectors = vectors_of(embeddings, url)
    return embedding_chunks(request, vectors, data.get("prompt_eval_count"))


class StreamDecoder:
    """What one NDJSON stream of ``/api/chat`` says, as stream chunks.

    ``feed`` each line as it comes; at the end of the body, ``end`` raises (a complete stream
    ends with its ``done`` line, which ``feed`` has answered with the final chunk).
    """

    __slots__ = ("_output_tokens", "_request", "_tool_index", "_url", "done", "started")

    def __init__(self, request: ChatRequest, url: str) -> None:
        """Decode the answer to ``request`` streamed from ``url`` (named in errors)."""
        self._request = request
        self._url = url
        self._output_tokens = 0
        self._tool_index = 0
        self.started = False
        """Whether the answer has begun (text or a tool call)."""
        self.done = False
        """The ``done`` line came: the last chunk has been given."""

    def feed(self, line: bytes) -> list[StreamChunk]:
        """Decode one line of the stream into the chunks it carries."""
        url = self._url
        data = stream_object(line.decode("utf-8", errors="replace"), url, "a line")
        if "error" in data:
            raise _stream_error(str(data["error"]), url, self._request.model)
        message = data.get("message") or {}
        # A chat's text is in its message, a raw completion's in ``response``.
        text = str(message.get("content") or data.get("response") or "")
        calls = _tool_calls(message, self._tool_index)
        self._tool_index += len(calls)
        chunks: list[StreamChunk] = []
        if text or calls:
            self.started = True
            tokens = 1 if text else 0
            self._output_tokens += tokens
            chunks.append(
                StreamChunk(text=text, output_tokens=tokens, tool_calls=calls)
            )
        if data.get("done"):
            self.done = True
            chunks.append(
                StreamChunk(
                    done=True,
                    finish_reason="tool_calls"
                    if self._tool_index
                    else str(data.get("done_reason") or "stop"),
                    usage=self._usage(data),
                )
            )
        return chunks

    def end(self) -> StreamChunk:
        """Raise: the body ended before its ``done`` line."""
        raise stream_closed(self._url)

    def _usage(self, data: dict[str, Any]) -> TokenUsage:
        prompt = data.get("prompt_eval_count")
        output = data.get("eval_count")
        estimate = estimated_usage(self._request, self._output_tokens)
        if not isinstance(output, int):
            return estimate
        # A cached prompt can leave prompt_eval_count out; the estimate fills only that gap.
        # Ollama counts the prompt tokens it evaluated: those it reused from a slot are not in it.
        return TokenUsage(
            prompt if isinstance(prompt, int) else estimate.prompt_tokens,
            output,
            "server",
            evaluated_prompt_tokens=prompt if isinstance(prompt, int) else None,
        )


def _tool_calls(message: dict[str, Any], first_index: int) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    for offset, raw in enumerate(message.get("tool_calls") or ()):
        function = raw.get("function") or {}
        arguments = json_object(function.get("arguments") or {})
        if arguments is None:
            raise MalformedStreamError(
                f"tool call arguments are not a JSON object: {function.get('arguments')!r:.80}"
            )
        calls.append(
            ToolCall(
                id=str(raw.get("id") or f"call_{first_index + offset}"),
                name=str(function.get("name", "")),
                arguments=arguments,
            )
        )
    return tuple(calls)


def _stream_error(message: str, url: str, model: str) -> BackendError:
    """Type an error reported inside the stream like the HTTP error it stands for."""
    lowered = message.lower()
    status = 500
    if "not found" in lowered and "model" in lowered:
        status = 404
    elif "busy" in lowered or "too many" in lowered:
        status = 503
    return http_error(status, json.dumps({"error": message}), url=url, model=model)


# --- written by the gateway --------------------------------------------------------------------


def ndjson_line(obj: Mapping[str, Any]) -> bytes:
    """Write one NDJSON line."""
    return json.dumps(obj).encode() + b"\n"


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + "Z"


class StreamEncoder:
    """Writes an answer's stream chunks as ``/api/chat`` (or ``/api/generate``) NDJSON lines.

    It also gathers the whole answer, for ``answer``: the single object a client that did not
    stream gets. Durations come from ``clock`` (seconds): prompt evaluation up to the first
    token, evaluation after it. A generate line carries its text in ``response``, a chat line in
    ``message``.
    """

    __slots__ = (
        "_chunks",
        "_clock",
        "_first_at",
        "_generate",
        "_model",
        "_started",
        "_wall_clock",
    )

    def __init__(
        self,
        *,
        model: str,
        generate: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Answer as ``model`` (``generate``: in ``/api/generate`` lines); it started now."""
        self._model = model
        self._generate = generate
        self._clock = clock
        self._wall_clock = wall_clock
        self._started = clock()
        self._first_at: float | None = None
        self._chunks: list[StreamChunk] = []

    def _line(
        self, text: str, calls: tuple[ToolCall, ...], *, done: bool
    ) -> dict[str, Any]:
        line: dict[str, Any] = {
            "model": self._model,
            "created_at": _iso(self._wall_clock()),
        }
        if self._generate:
            line["response"] = text
        else:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [
                    {"id": call.id, **tool_call_to_wire(call)} for call in calls
                ]
            line["message"] = message
        line["done"] = done
        return line

    def feed(self, chunk: StreamChunk) -> list[dict[str, Any]]:
        """Return the lines that carry ``chunk`` (the last one with counts and durations)."""
        self._chunks.append(chunk)
        lines: list[dict[str, Any]] = []
        if chunk.text or chunk.tool_calls:
            if self._first_at is None:
                self._first_at = self._clock()
            lines.append(self._line(chunk.text, chunk.tool_calls, done=False))
        if chunk.done:
            lines.append(self._final("", ()))
        return lines

    def encode(self, chunk: StreamChunk) -> bytes:
        """Return the NDJSON lines of ``chunk``."""
        return b"".join(ndjson_line(line) for line in self.feed(chunk))

    def answer(self) -> dict[str, Any]:
        """Return the single object of the whole answer fed so far."""
        answer = Answer.of(self._chunks)
        return self._final(answer.text, answer.tool_calls)

    def _final(self, text: str, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
        answer = Answer.of(self._chunks)
        now = self._clock()
        first = self._first_at if self._first_at is not None else now
        line = self._line(text, calls, done=True)
        reason = answer.finish_reason
        line["done_reason"] = reason if reason in {"length", "load"} else "stop"
        line["total_duration"] = _ns(now - self._started)
        line["load_duration"] = 0
        usage = answer.usage
        if usage is not None:
            line["prompt_eval_count"] = usage.prompt_tokens
        line["prompt_eval_duration"] = _ns(first - self._started)
        line["eval_count"] = (
            usage.output_tokens
            if usage is not None
            else sum(chunk.output_tokens for chunk in self._chunks)
        )
        line["eval_duration"] = _ns(now - first)
        return line


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def embed_to_wire(
    vectors: Sequence[Sequence[float]],
    usage: TokenUsage | None,
    *,
    model: str,
    duration_s: float,
) -> dict[str, Any]:
    """Write an ``/api/embed`` answer."""
    return {
        "model": model,
        "embeddings": [list(vector) for vector in vectors],
        "total_duration": _ns(duration_s),
        "load_duration": 0,
        "prompt_eval_count": usage.prompt_tokens if usage is not None else 0,
    }


_NO_DETAILS: dict[str, Any] = {
    "parent_model": "",
    "format": "gguf",
    "family": "",
    "families": None,
    "parameter_size": "",
    "quantization_level": "",
}
"""The details of a model the server behind describes in no Ollama terms."""


def _model_entry(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": name,
        "modified_at": _iso(0),
        "size": 0,
        "digest": "",
        "details": dict(_NO_DETAILS),
    }


def tags_to_wire(models: Iterable[str]) -> dict[str, Any]:
    """Write ``/api/tags``: the models the server serves."""
    return {"models": [_model_entry(name) for name in models]}


def ps_to_wire(models: Iterable[str], context_length: int | None) -> dict[str, Any]:
    """Write ``/api/ps``: the models loaded now (kept loaded: they expire in 2099)."""
    return {
        "models": [
            {
                **_model_entry(name),
                "expires_at": "2099-01-01T00:00:00Z",
                "size_vram": 0,
                "context_length": context_length or 0,
            }
            for name in models
        ]
    }


def show_to_wire(context_length: int | None, *, tools: bool = True) -> dict[str, Any]:
    """Write ``/api/show`` of a model the server describes in no Ollama terms."""
    info: dict[str, Any] = {"general.architecture": ""}
    if context_length:
        info["general.context_length"] = context_length
    return {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": dict(_NO_DETAILS),
        "model_info": info,
        "capabilities": ["completion", "tools"] if tools else ["completion"],
    }


def error_body(message: str) -> dict[str, Any]:
    """Write an error as Ollama does."""
    return {"error": message}
