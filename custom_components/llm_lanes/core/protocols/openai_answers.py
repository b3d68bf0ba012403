"""OpenAI's answers, both directions.

The backend reads a server's: ``StreamDecoder`` turns the server-sent events of a chat or raw
completion stream into ``StreamChunk`` s: one delta is one token, tool calls arriving in pieces
keyed by index are assembled for the final chunk, usage comes from the usage event or
llama.cpp's ``timings`` (estimated when neither comes), an echo of the resume prefix is dropped,
and error events raise the typed error of their status; ``embedding_answer`` reads embeddings.
The gateway writes its own: ``StreamEncoder`` the ``chat.completion.chunk`` events of a stream
and the ``chat.completion`` object of a whole answer, ``CompletionEncoder`` the
``text_completion`` ones; ``embeddings_to_wire``, ``models_to_wire`` (``/v1/models``) and
``error_body`` the other answers.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
import json
import struct
from typing import Any

from custom_components.llm_lanes.core.errors import (
    BackendError,
    MalformedStreamError,
    http_error,
)
from custom_components.llm_lanes.core.model import (
    Answer,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    StreamChunk,
    TokenUsage,
    ToolCall,
)
from custom_components.llm_lanes.core.protocols.common import (
    PrefixEcho,
    embedding_chunks,
    estimated_usage,
    stream_closed,
    stream_object,
    vectors_of,
)
from custom_components.llm_lanes.core.protocols.openai_requests import tool_call_to_wire

SSE_DONE = b"data: [DONE]\n\n"


# --- read by the backend -----------------------------------------------------------------------


def embedding_answer(
    data: Any, request: EmbeddingRequest, url: str
) -> list[StreamChunk]:
    """Read a ``/v1/embeddings`` answer as the chunks of ``common.embedding_chunks``."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise MalformedStreamError(f"{url} answered embeddings without data", url=url)
    ordered = sorted(entries, key=lambda entry: int(entry.get("index") or 0))
    vectors = vectors_of((entry.get("embedding") for entry in ordered), url)
    usage = data.get("usage")
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return embedding_chunks(request, vectors, prompt)


@dataclass(slots=True)
class _PartialToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class StreamDecoder:
    """What one SSE stream of ``/v1/chat/completions`` says, as stream chunks.

    ``feed`` each line as it comes; at the end of the body, ``end`` gives the final chunk (or
    raises when the server stopped before it was done).
    """

    request: ChatRequest
    url: str
    """Where the stream comes from (named in errors)."""
    finish_reason: str | None = None
    done: bool = False
    """``[DONE]`` came: the last chunk has been given."""
    _streamed_tokens: int = field(default=0, init=False)
    _usage: TokenUsage | None = field(default=None, init=False)
    _tool_calls: dict[int, _PartialToolCall] = field(default_factory=dict, init=False)
    _echo: PrefixEcho = field(init=False)

    def __post_init__(self) -> None:
        """Watch for an echo of the resume prefix (llama.cpp streams it back first).

        A raw completion's prefix is part of its prompt, which servers do not echo.
        """
        raw = isinstance(self.request, CompletionRequest)
        self._echo = PrefixEcho("" if raw else self.request.assistant_prefix)

    @property
    def started(self) -> bool:
        """Whether the answer has begun (a token or a tool call, shown or held back)."""
        return bool(self._streamed_tokens or self._echo.held_tokens or self._tool_calls)

    def feed(self, raw: bytes) -> list[StreamChunk]:
        """Decode one line of the stream into the chunks it carries."""
        data = _sse_data(raw, self.url)
        if data is None:
            return []
        if isinstance(data, str):  # "[DONE]"
            self.done = True
            return [self._final()]
        if "error" in data:
            raise _stream_error(data, self.url, self.request.model)
        usage = _usage_from(data)
        if usage is not None:
            self._usage = usage
        chunks: list[StreamChunk] = []
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            # A chat's text is in its delta, a raw completion's in the choice itself.
            text = delta.get("content") or choice.get("text") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            if delta.get("tool_calls"):
                self._add_tool_call_pieces(delta["tool_calls"])
            if text:
                # One delta is one token on llama.cpp, vLLM and LM Studio.
                shown, tokens = self._echo.text(str(text))
                self._streamed_tokens += tokens
                if shown or tokens:
                    chunks.append(StreamChunk(text=shown, output_tokens=tokens))
            elif reasoning:
                # Reasoning tokens cost the same as answer tokens but carry no answer text.
                self._streamed_tokens += 1
                chunks.append(StreamChunk(output_tokens=1))
            elif delta.get("tool_calls"):
                self._streamed_tokens += 1
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return chunks

    def end(self) -> StreamChunk:
        """Return the final chunk once the body ended without ``[DONE]``."""
        if self.finish_reason is None:
            raise stream_closed(self.url)
        return self._final()

    def _add_tool_call_pieces(self, pieces: list[dict[str, Any]]) -> None:
        for piece in pieces:
            index = int(piece.get("index", len(self._tool_calls)))
            call = self._tool_calls.setdefault(index, _PartialToolCall())
            if piece.get("id"):
                call.id = str(piece["id"])
            function = piece.get("function") or {}
            if function.get("name"):
                call.name += str(function["name"])
            if function.get("arguments"):
                arguments = function["arguments"]
                call.arguments.append(
                    arguments if isinstance(arguments, str) else json.dumps(arguments)
                )

    def _assembled_tool_calls(self) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for index in sorted(self._tool_calls):
            partial = self._tool_calls[index]
            text = "".join(partial.arguments).strip() or "{}"
            try:
                arguments = json.loads(text)
            except ValueError as err:
                raise MalformedStreamError(
                    f"{self.url} streamed tool call arguments that are not JSON: {text[:80]!r}",
                    url=self.url,
                ) from err
            if not isinstance(arguments, dict):
                raise MalformedStreamError(
                    f"{self.url} streamed tool call arguments that are not an object",
                    url=self.url,
                )
            calls.append(
                ToolCall(
                    id=partial.id or f"call_{index}",
                    name=partial.name,
                    arguments=arguments,
                )
            )
        return tuple(calls)

    def _final(self) -> StreamChunk:
        calls = self._assembled_tool_calls()
        reason = self.finish_reason or "stop"
        if calls and reason == "stop":
            reason = "tool_calls"
        usage = self._usage or estimated_usage(self.request, self._streamed_tokens)
        return StreamChunk(
            tool_calls=calls, done=True, finish_reason=reason, usage=usage
        )


def _sse_data(raw: bytes, url: str) -> dict[str, Any] | str | None:
    """Decode one SSE line: a JSON object, ``"[DONE]"``, or None for lines that carry no data."""
    line = raw.decode("utf-8", errors="replace")
    if line.startswith((":", "event:", "id:", "retry:")):
        return None
    if line.startswith(("data:", "error:")):
        field_name, _, payload = line.partition(":")
        payload = payload.strip()
        if payload == "[DONE]":
            return "[DONE]"
        data = stream_object(payload, url, "an event")
        if field_name == "error" and "error" not in data:
            data = {"error": data}
        return data
    raise MalformedStreamError(
        f"{url} sent a line that is not a server-sent event: {line[:80]!r}", url=url
    )


def _usage_from(data: dict[str, Any]) -> TokenUsage | None:
    usage = data.get("usage")
    timings = data.get("timings")  # llama.cpp, also without include_usage
    if not isinstance(timings, dict):
        timings = {}
    cached = _int_field(timings, "cache_n")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = details["cached_tokens"]  # vLLM, llama.cpp
        return TokenUsage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage["completion_tokens"]),
            source="server",
            cached_prompt_tokens=cached,
        )
    if isinstance(timings.get("predicted_n"), int):
        return TokenUsage(
            prompt_tokens=int(timings.get("prompt_n") or 0) + (cached or 0),
            output_tokens=int(timings["predicted_n"]),
            source="server",
            cached_prompt_tokens=cached,
        )
    return None


def _int_field(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _stream_error(data: dict[str, Any], url: str, model: str) -> BackendError:
    """Type an error event by the status it names (500 when it names none)."""
    error = data["error"]
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) else 500
    return http_error(status, json.dumps(data), url=url, model=model)


# --- written by the gateway --------------------------------------------------------------------


def sse_event(event: Mapping[str, Any]) -> bytes:
    """Write one server-sent event."""
    return f"data: {json.dumps(event)}\n\n".encode()


def usage_to_wire(usage: TokenUsage) -> dict[str, int]:
    """Write token counts as OpenAI does."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.prompt_tokens + usage.output_tokens,
    }


@dataclass(slots=True, kw_only=True)
class _EventEncoder:
    """What the encoders of chat and raw completion streams share: ids, the end, the bytes."""

    model: str
    completion_id: str
    created: int
    """Unix seconds."""
    include_usage: bool = False
    _chunks: list[StreamChunk] = field(default_factory=list, init=False)

    def _event(self, content: Any, finish_reason: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def _ending(self, chunk: StreamChunk, empty: Any) -> list[dict[str, Any]]:
        """Return the events after the last chunk: its finish reason, the usage if asked."""
        events = [self._event(empty, chunk.finish_reason or "stop")]
        if self.include_usage and chunk.usage is not None:
            final = self._event(empty, None)
            final["choices"] = []
            final["usage"] = usage_to_wire(chunk.usage)
            events.append(final)
        return events

    def feed(self, chunk: StreamChunk) -> list[dict[str, Any]]:
        """Return the events that carry ``chunk``."""
        raise NotImplementedError

    def encode(self, chunk: StreamChunk) -> bytes:
        """Return the server-sent events of ``chunk``; after the last one, ``[DONE]``."""
        data = b"".join(sse_event(event) for event in self.feed(chunk))
        return data + SSE_DONE if chunk.done else data


@dataclass(slots=True, kw_only=True)
class StreamEncoder(_EventEncoder):
    """Writes an answer's stream chunks as ``chat.completion.chunk`` events.

    It also gathers the whole answer, for ``answer``: the ``chat.completion`` object a client
    that did not stream gets.
    """

    _tools_sent: int = field(default=0, init=False)

    def _event(
        self, content: dict[str, Any], finish_reason: str | None
    ) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": content, "finish_reason": finish_reason}],
        }

    def feed(self, chunk: StreamChunk) -> list[dict[str, Any]]:
        """Return the events that carry ``chunk`` (the first one also names the role)."""
        events: list[dict[str, Any]] = []
        if not self._chunks:
            events.append(self._event({"role": "assistant", "content": ""}, None))
        self._chunks.append(chunk)
        if chunk.text:
            events.append(self._event({"content": chunk.text}, None))
        if chunk.tool_calls:
            calls = [
                {"index": self._tools_sent + offset, **tool_call_to_wire(call)}
                for offset, call in enumerate(chunk.tool_calls)
            ]
            self._tools_sent += len(calls)
            events.append(self._event({"tool_calls": calls}, None))
        if chunk.done:
            events += self._ending(chunk, {})
        return events

    def answer(self) -> dict[str, Any]:
        """Return the ``chat.completion`` object of the whole answer fed so far."""
        answer = Answer.of(self._chunks)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": answer.text or (None if answer.tool_calls else ""),
        }
        if answer.tool_calls:
            message["tool_calls"] = [tool_call_to_wire(c) for c in answer.tool_calls]
        result: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": answer.finish_reason or "stop",
                }
            ],
        }
        if answer.usage is not None:
            result["usage"] = usage_to_wire(answer.usage)
        return result


@dataclass(slots=True, kw_only=True)
class CompletionEncoder(_EventEncoder):
    """Writes a raw completion's stream chunks as ``text_completion`` events.

    It also gathers the whole answer, for ``answer``: the object a client that did not stream
    gets.
    """

    def _event(self, content: str, finish_reason: str | None) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "text": content,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
        }

    def feed(self, chunk: StreamChunk) -> list[dict[str, Any]]:
        """Return the events that carry ``chunk``."""
        self._chunks.append(chunk)
        events: list[dict[str, Any]] = []
        if chunk.text:
            events.append(self._event(chunk.text, None))
        if chunk.done:
            events += self._ending(chunk, "")
        return events

    def answer(self) -> dict[str, Any]:
        """Return the ``text_completion`` object of the whole answer fed so far."""
        answer = Answer.of(self._chunks)
        result = self._event(answer.text, answer.finish_reason or "stop")
        if answer.usage is not None:
            result["usage"] = usage_to_wire(answer.usage)
        return result


def embeddings_to_wire(
    vectors: Sequence[Sequence[float]],
    usage: TokenUsage | None,
    *,
    model: str,
    base64_vectors: bool = False,
) -> dict[str, Any]:
    """Write an embeddings answer (``base64_vectors``: packed little-endian float32)."""
    prompt = usage.prompt_tokens if usage is not None else 0

    def encoded(vector: Sequence[float]) -> list[float] | str:
        if not base64_vectors:
            return list(vector)
        packed = struct.pack(f"<{len(vector)}f", *vector)
        return base64.b64encode(packed).decode("ascii")

    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": encoded(vector)}
            for index, vector in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def model_to_wire(model: str, *, owner: str, created: int = 0) -> dict[str, Any]:
    """Write one entry of ``/v1/models``."""
    return {"id": model, "object": "model", "created": created, "owned_by": owner}


def models_to_wire(models: Iterable[str], *, owner: str) -> dict[str, Any]:
    """Write the ``/v1/models`` list."""
    return {
        "object": "list",
        "data": [model_to_wire(model, owner=owner) for model in models],
    }


def error_body(
    message: str, *, kind: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """Write an error as OpenAI does (``kind``: ``invalid_request_error``, ...)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
