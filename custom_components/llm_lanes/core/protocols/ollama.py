"""Ollama's wire format, both directions.

Chat (``/api/chat``), raw completions (``/api/generate``), embeddings (``/api/embed``) and the
documents that describe the models (``/api/tags``, ``/api/show``, ``/api/ps``).

Client side (the Ollama backend): ``chat_body`` and ``generate_body`` (a raw completion) build
streamed requests, sampling settings in ``options``; ``StreamDecoder`` turns the NDJSON lines of
either back into ``StreamChunk`` s: a line with text is one token, tool calls come whole
(arguments as objects), the final line's counts are the usage (estimated where the server leaves
them out), and an error line raises the typed error it stands for. ``embed_body`` /
``embed_answer`` do embeddings.

Server side (the gateway): ``parse_chat``, ``parse_generate`` and ``parse_embed`` read a client's
requests (``keep_alive`` and ``think`` travel in ``ChatRequest.options``, and go back to the top
level of a body); ``StreamEncoder`` writes the NDJSON lines of a chat or generate stream, ending
with the counts and durations, and the single object of a whole answer; ``embed_to_wire``,
``tags_to_wire``, ``show_to_wire``, ``ps_to_wire`` and ``error_body`` write the other answers.

Ollama carries no tool call ids in requests: parsed calls are numbered ``call_0``, ``call_1`` ...
through the conversation, and a tool result names its tool instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
import json
import time
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
    embedding_chunks,
    estimated_usage,
    json_object,
    sampling_to_wire,
    split_prefix,
    stream_closed,
    stream_object,
    tools_to_wire,
    vectors_of,
)

CHAT_PATH = "/api/chat"
GENERATE_PATH = "/api/generate"
EMBED_PATH = "/api/embed"
SHOW_PATH = "/api/show"
TOP_LEVEL_OPTIONS = ("keep_alive", "think", "truncate", "dimensions")
"""Request options that Ollama takes at the top level of the body, not in ``options``.

``keep_alive`` and ``think`` (chat, generate), ``truncate`` and ``dimensions`` (embed)."""
_SAMPLING_OPTIONS = frozenset({"num_predict", "temperature", "top_p", "seed", "stop"})
"""Ollama ``options`` that are fields of ``ChatRequest`` (the others pass through)."""


# --- client side: the request ----------------------------------------------------------------


def message_to_wire(message: ChatMessage) -> dict[str, Any]:
    """Convert a message to Ollama's shape (tool call arguments are objects, not strings)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [
            {"function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    if message.role == "tool" and message.name:
        data["tool_name"] = message.name
    return data


def chat_body(request: ChatRequest, keep_alive: int | str | None) -> dict[str, Any]:
    """Build the streamed ``/api/chat`` body of a request.

    ``keep_alive`` is the backend's own; a ``keep_alive`` in the request's options wins.
    """
    messages = [message_to_wire(message) for message in request.messages]
    if request.assistant_prefix:
        # Ollama continues a final assistant message instead of starting a new one.
        messages.append({"role": "assistant", "content": request.assistant_prefix})
    body = _body(request, keep_alive, {"messages": messages, "stream": True})
    if request.tools:
        body["tools"] = tools_to_wire(request.tools)
    if request.json_schema is not None:
        body["format"] = request.json_schema
    elif request.json_mode:
        body["format"] = "json"
    return body


def generate_body(
    request: CompletionRequest, keep_alive: int | str | None
) -> dict[str, Any]:
    """Build the streamed raw ``/api/generate`` body of a completion (resumed: prompt + prefix)."""
    content = {
        "prompt": request.prompt + request.assistant_prefix,
        "raw": True,
        "stream": True,
    }
    return _body(request, keep_alive, content)


def embed_body(
    request: EmbeddingRequest, keep_alive: int | str | None
) -> dict[str, Any]:
    """Build the ``/api/embed`` body of an embeddings request."""
    return _body(request, keep_alive, {"input": list(request.inputs)})


def _body(
    request: ChatRequest, keep_alive: int | str | None, content: dict[str, Any]
) -> dict[str, Any]:
    """Start a body: the model, ``content``, sampling settings and options in ``options``.

    ``keep_alive`` is the backend's own; a ``keep_alive`` in the request's options wins. The
    options Ollama takes at the top level (``TOP_LEVEL_OPTIONS``) go there.
    """
    options = sampling_to_wire(request, "num_predict")
    top_level = {"keep_alive": keep_alive} if keep_alive is not None else {}
    for key, value in request.options.items():
        if key in TOP_LEVEL_OPTIONS:
            top_level[key] = value
        else:
            options[key] = value
    return {"model": request.model, **content, "options": options, **top_level}


def embed_answer(data: Any, request: EmbeddingRequest, url: str) -> list[StreamChunk]:
    """Read an ``/api/embed`` answer as the chunks of ``common.embedding_chunks``."""
    embeddings = data.get("embeddings") if isinstance(data, dict) else None
    if not isinstance(embeddings, list):
        raise MalformedStreamError(f"{url} answered without embeddings", url=url)
    vectors = vectors_of(embeddings, url)
    return embedding_chunks(request, vectors, data.get("prompt_eval_count"))


# --- client side: the stream -------------------------------------------------------------------


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


# --- server side: the request ------------------------------------------------------------------


def parse_chat(body: Any) -> ParsedChat:
    """Read a client's ``/api/chat`` request (``InvalidRequestError`` names a bad field).

    An empty conversation is valid (Ollama loads the model and answers at once).
    """
    fields = Fields(body)
    parsed: list[ChatMessage] = []
    calls = 0
    for item in fields.objects("messages"):
        message = _message_from_wire(item, calls)
        calls += len(message.tool_calls)
        parsed.append(message)
    messages, prefix = split_prefix(parsed)
    request = ChatRequest(
        messages=messages,
        tools=fields.tools(),
        assistant_prefix=prefix,
        **_settings(fields),
    )
    return _parsed(fields, request, load_only=not messages)


def parse_generate(body: Any) -> ParsedChat:
    """Read a client's ``/api/generate`` request.

    ``raw`` asks for a raw completion of ``prompt``; otherwise the prompt (and ``system``) is
    a chat of one turn, which the server templates as Ollama would. An empty prompt only loads
    the model.
    """
    fields = Fields(body)
    prompt = fields.string("prompt", default="")
    system = fields.string("system", default="")
    fields.absent("suffix", "a suffix is not supported")
    fields.absent("template", "a template of the request's own is not supported")
    fields.absent("context", "the token context of an earlier answer is not supported")
    fields.absent("images", "images are not supported")
    request: ChatRequest
    if fields.boolean("raw", default=False):
        request = CompletionRequest(messages=(), prompt=prompt, **_settings(fields))
    else:
        turn: list[ChatMessage] = []
        if prompt:
            if system:
                turn.append(ChatMessage(role="system", content=system))
            turn.append(ChatMessage(role="user", content=prompt))
        request = ChatRequest(messages=tuple(turn), **_settings(fields))
    return _parsed(fields, request, load_only=not prompt)


def _settings(fields: Fields) -> dict[str, Any]:
    """Read what chat and generate requests share: model, sampling options, output format."""
    options = fields.nested("options")
    max_tokens = options.integer("num_predict")
    extra = options.others(_SAMPLING_OPTIONS)
    extra.update(
        {key: fields.get(key) for key in TOP_LEVEL_OPTIONS if key in fields.value}
    )
    json_schema, json_mode = _format(fields.get("format"))
    return {
        "model": fields.string("model"),
        # num_predict -1 (no limit) and -2 (fill the context) set no limit of ours.
        "max_tokens": None if max_tokens is None or max_tokens < 0 else max_tokens,
        "temperature": options.number("temperature"),
        "top_p": options.number("top_p"),
        "seed": options.integer("seed"),
        "stop": options.stop("stop"),
        "json_schema": json_schema,
        "json_mode": json_mode,
        "options": extra,
    }


def _parsed(fields: Fields, request: ChatRequest, *, load_only: bool) -> ParsedChat:
    # Ollama's last line always carries the counts.
    stream = fields.boolean("stream", default=True)
    return ParsedChat(
        request=request, stream=stream, include_usage=True, load_only=load_only
    )


def parse_embed(body: Any) -> ParsedEmbeddings:
    """Read a client's ``/api/embed`` request (one text or a list of them)."""
    fields = Fields(body)
    inputs = fields.texts("input")
    if not inputs:
        raise InvalidRequestError("input", "must hold at least one text")
    options = dict(fields.nested("options").value)
    options.update(
        {key: fields.get(key) for key in TOP_LEVEL_OPTIONS if key in fields.value}
    )
    request = EmbeddingRequest(
        model=fields.string("model"), messages=(), inputs=inputs, options=options
    )
    return ParsedEmbeddings(request=request)


def _message_from_wire(fields: Fields, calls_before: int) -> ChatMessage:
    role = fields.role()
    if fields.get("images"):
        raise InvalidRequestError(fields.name("images"), "images are not supported")
    name = None
    if role == "tool":
        name = fields.string("tool_name", default="") or None
    return ChatMessage(
        role=role,
        content=fields.text("content"),
        tool_calls=fields.tool_calls("tool_calls", first_index=calls_before),
        name=name,
    )


def _format(raw: Any) -> tuple[dict[str, Any] | None, bool]:
    """Return the JSON schema asked for and whether any JSON object is asked for."""
    if raw is None or raw == "":
        return None, False
    if raw == "json":
        return None, True
    if isinstance(raw, dict):
        return raw, False
    raise InvalidRequestError("format", 'must be "json" or a JSON schema')


# --- server side: the answer -------------------------------------------------------------------


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
                    {
                        "id": call.id,
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in calls
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
