"""OpenAI's wire format, both directions.

Chat (``/v1/chat/completions``), raw completions (``/v1/completions``), embeddings
(``/v1/embeddings``) and the model list (``/v1/models``).

Client side (the OpenAI-compatible backend): ``chat_body`` and ``completion_body`` build streamed
requests with ``include_usage``; ``StreamDecoder`` turns the server-sent events of either back
into ``StreamChunk`` s: one delta is one token, tool calls arriving in pieces keyed by index are
assembled for the final chunk, usage comes from the usage event or llama.cpp's ``timings``
(estimated when neither comes), an echo of the resume prefix is dropped, and error events raise
the typed error of their status. ``embedding_body`` / ``embedding_answer`` do embeddings.

Server side (the gateway): ``parse_chat``, ``parse_completion`` and ``parse_embeddings`` read a
client's requests (a final assistant message is the beginning of the answer, continued as
llama.cpp does); ``StreamEncoder`` writes the ``chat.completion.chunk`` events of a stream and the
``chat.completion`` object of a whole answer, ``CompletionEncoder`` the ``text_completion`` ones;
``embeddings_to_wire``, ``models_to_wire`` and ``error_body`` write the other answers.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
import json
import struct
from typing import Any

from ..backends.base import (
    Answer,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    StreamChunk,
    TokenUsage,
    ToolCall,
)
from ..errors import BackendError, InvalidRequestError, MalformedStreamError, http_error
from .common import (
    Fields,
    ParsedChat,
    ParsedEmbeddings,
    PrefixEcho,
    embedding_chunks,
    estimated_usage,
    sampling_to_wire,
    split_prefix,
    stream_closed,
    stream_object,
    tools_to_wire,
    vectors_of,
)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
SSE_DONE = b"data: [DONE]\n\n"

_READ_FIELDS = frozenset({
    "model", "messages", "tools", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "seed", "stop", "response_format", "stream", "stream_options", "priority", "n",
    "continue_final_message", "add_generation_prompt",
})  # fmt: skip
"""Request fields ``parse_chat`` reads; every other one is passed through in ``options``."""
_READ_COMPLETION_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
    "stream_options", "n", "echo", "suffix", "best_of", "logprobs",
})  # fmt: skip
"""Request fields ``parse_completion`` reads; every other one is passed through in ``options``."""


# --- client side: the request ----------------------------------------------------------------


def message_to_wire(message: ChatMessage) -> dict[str, Any]:
    """Convert a message to the OpenAI shape (tool call arguments as JSON strings)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [tool_call_to_wire(call) for call in message.tool_calls]
    if message.role == "tool":
        if message.tool_call_id:
            data["tool_call_id"] = message.tool_call_id
        if message.name:
            data["name"] = message.name
    return data


def tool_call_to_wire(call: ToolCall) -> dict[str, Any]:
    """Write a tool call (its arguments as JSON text)."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def chat_body(
    request: ChatRequest, server_fields: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Build the streamed ``/v1/chat/completions`` body of a request.

    ``server_fields`` are what a kind of server adds (vLLM's ``priority``); the request's own
    ``options`` still win over them.
    """
    messages = [message_to_wire(message) for message in request.messages]
    if request.assistant_prefix:
        messages.append({"role": "assistant", "content": request.assistant_prefix})
    body = _streamed_body(request, {"messages": messages})
    if request.tools:
        body["tools"] = tools_to_wire(request.tools)
    if request.json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": "response",
                "schema": request.json_schema,
                "strict": True,
            },
        }
    elif request.json_mode:
        body["response_format"] = {"type": "json_object"}
    return _with_extras(body, request, server_fields)


def completion_body(
    request: CompletionRequest, server_fields: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Build the streamed ``/v1/completions`` body of a raw completion (resumed: prompt + prefix)."""
    body = _streamed_body(
        request, {"prompt": request.prompt + request.assistant_prefix}
    )
    return _with_extras(body, request, server_fields)


def _streamed_body(request: ChatRequest, content: dict[str, Any]) -> dict[str, Any]:
    """Start a streamed body with usage: the model, ``content``, the sampling settings."""
    return {
        "model": request.model,
        **content,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling_to_wire(request, "max_tokens"),
    }


def _with_extras(
    body: dict[str, Any], request: ChatRequest, server_fields: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Add what the kind of server needs, then the request's own options (which win)."""
    body.update(server_fields or {})
    body.update(request.options)
    return body


def embedding_body(request: EmbeddingRequest) -> dict[str, Any]:
    """Build the ``/v1/embeddings`` body of an embeddings request (vectors as numbers)."""
    return {
        "model": request.model,
        "input": list(request.inputs),
        "encoding_format": "float",
        **request.options,
    }


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


# --- client side: the stream -------------------------------------------------------------------


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


# --- server side: the request ------------------------------------------------------------------


def parse_chat(body: Any) -> ParsedChat:
    """Read a client's ``/v1/chat/completions`` request (``InvalidRequestError`` names a bad field)."""
    fields = Fields(body)
    raw_messages = fields.objects("messages")
    if not raw_messages:
        raise InvalidRequestError("messages", "must hold at least one message")
    messages, prefix = split_prefix([_message_from_wire(m) for m in raw_messages])
    _one_choice(fields)
    # The newer name wins over the older one.
    newer = fields.get("max_completion_tokens") is not None
    json_schema, json_mode = _response_format(fields.nested("response_format"))
    request = ChatRequest(
        model=fields.string("model"),
        messages=messages,
        tools=fields.tools(),
        max_tokens=_max_tokens(
            fields, "max_completion_tokens" if newer else "max_tokens"
        ),
        temperature=fields.number("temperature"),
        top_p=fields.number("top_p"),
        seed=fields.integer("seed"),
        stop=fields.stop("stop"),
        json_schema=json_schema,
        json_mode=json_mode,
        assistant_prefix=prefix,
        priority=fields.integer("priority"),
        options=fields.others(_READ_FIELDS),
    )
    return _parsed(fields, request)


def parse_completion(body: Any) -> ParsedChat:
    """Read a client's ``/v1/completions`` request: one prompt, continued as it is."""
    fields = Fields(body)
    prompts = fields.texts("prompt")
    if len(prompts) != 1:
        raise InvalidRequestError("prompt", "only one prompt is supported")
    _one_choice(fields)
    fields.absent("echo", "echoing the prompt is not supported")
    fields.absent("suffix", "a suffix is not supported")
    fields.absent("logprobs", "log probabilities are not supported")
    if fields.integer("best_of") not in {None, 1}:
        raise InvalidRequestError("best_of", "only one candidate is supported")
    request = CompletionRequest(
        model=fields.string("model"),
        messages=(),
        prompt=prompts[0],
        max_tokens=_max_tokens(fields, "max_tokens"),
        temperature=fields.number("temperature"),
        top_p=fields.number("top_p"),
        seed=fields.integer("seed"),
        stop=fields.stop("stop"),
        options=fields.others(_READ_COMPLETION_FIELDS),
    )
    return _parsed(fields, request)


def _one_choice(fields: Fields) -> None:
    if fields.integer("n") not in {None, 1}:
        raise InvalidRequestError("n", "only one choice is supported")


def _max_tokens(fields: Fields, key: str) -> int | None:
    max_tokens = fields.integer(key)
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequestError(key, "must be at least 1")
    return max_tokens


def _parsed(fields: Fields, request: ChatRequest) -> ParsedChat:
    """Add how the client wants the answer delivered (streamed or not, usage at the end)."""
    include_usage = fields.nested("stream_options").boolean(
        "include_usage", default=False
    )
    return ParsedChat(
        request=request,
        stream=fields.boolean("stream", default=False),
        include_usage=include_usage,
    )


def parse_embeddings(body: Any) -> ParsedEmbeddings:
    """Read a client's ``/v1/embeddings`` request (text inputs; vectors as floats or base64)."""
    fields = Fields(body)
    inputs = fields.texts("input")
    if not inputs:
        raise InvalidRequestError("input", "must hold at least one text")
    encoding = fields.string("encoding_format", default="float")
    if encoding not in {"float", "base64"}:
        raise InvalidRequestError("encoding_format", "must be float or base64")
    dimensions = fields.integer("dimensions")
    request = EmbeddingRequest(
        model=fields.string("model"),
        messages=(),
        inputs=inputs,
        options={} if dimensions is None else {"dimensions": dimensions},
    )
    return ParsedEmbeddings(request=request, base64=encoding == "base64")


def _message_from_wire(fields: Fields) -> ChatMessage:
    if fields.get("role") == "developer":  # OpenAI's newer name for the system role
        fields = Fields({**fields.value, "role": "system"}, fields.where)
    role = fields.role()
    call_id = name = None
    if role == "tool":
        call_id = fields.string("tool_call_id", default="") or None
        name = fields.string("name", default="") or None
    return ChatMessage(
        role=role,
        content=fields.text("content"),
        tool_calls=fields.tool_calls("tool_calls"),
        tool_call_id=call_id,
        name=name,
    )


def _response_format(fields: Fields) -> tuple[dict[str, Any] | None, bool]:
    """Return the JSON schema asked for and whether any JSON object is asked for."""
    kind = fields.string("type", default="text")
    if kind == "json_schema":
        spec = fields.nested("json_schema", required=True)
        return spec.nested("schema", required=True).value, False
    if kind not in {"text", "json_object"}:
        raise InvalidRequestError(
            fields.name("type"), "must be text, json_object or json_schema"
        )
    return None, kind == "json_object"


# --- server side: the answer -------------------------------------------------------------------


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
