"""Ollama's ``/api/chat`` wire format, both directions.

Client side (the Ollama backend): ``chat_body`` builds a streamed request, sampling settings in
``options``; ``StreamDecoder`` turns the NDJSON lines back into ``StreamChunk`` s: a line with text
is one token, tool calls come whole (arguments as objects), the final line's counts are the usage
(estimated where the server leaves them out), and an error line raises the typed error it stands
for.

Server side (the gateway): ``parse_chat`` reads a client's request (``keep_alive`` and ``think``
travel in ``ChatRequest.options``, and go back to the top level of a body); ``StreamEncoder``
writes the NDJSON lines of a stream, ending with the counts and durations, and the single object
of a whole answer.

Ollama carries no tool call ids in requests: parsed calls are numbered ``call_0``, ``call_1`` ...
through the conversation, and a tool result names its tool instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import json
import time
from typing import Any

from ..backends.base import (
    Answer,
    ChatMessage,
    ChatRequest,
    StreamChunk,
    TokenUsage,
    ToolCall,
)
from ..errors import BackendError, InvalidRequestError, MalformedStreamError, http_error
from .common import (
    Fields,
    ParsedChat,
    estimated_usage,
    json_object,
    sampling_to_wire,
    split_prefix,
    stream_closed,
    stream_object,
    tools_to_wire,
)

CHAT_PATH = "/api/chat"
TOP_LEVEL_OPTIONS = ("keep_alive", "think")
"""Request options that Ollama takes at the top level of the body, not in ``options``."""
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
    options = sampling_to_wire(request, "num_predict")
    top_level = {"keep_alive": keep_alive} if keep_alive is not None else {}
    for key, value in request.options.items():
        if key in TOP_LEVEL_OPTIONS:
            top_level[key] = value
        else:
            options[key] = value
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "stream": True,
        "options": options,
        **top_level,
    }
    if request.tools:
        body["tools"] = tools_to_wire(request.tools)
    if request.json_schema is not None:
        body["format"] = request.json_schema
    elif request.json_mode:
        body["format"] = "json"
    return body


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
        text = str(message.get("content") or "")
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
        return TokenUsage(
            prompt if isinstance(prompt, int) else estimate.prompt_tokens,
            output,
            "server",
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
    options = fields.nested("options")
    max_tokens = options.integer("num_predict")
    extra = options.others(_SAMPLING_OPTIONS)
    extra.update(
        {key: fields.get(key) for key in TOP_LEVEL_OPTIONS if key in fields.value}
    )
    json_schema, json_mode = _format(fields.get("format"))
    request = ChatRequest(
        model=fields.string("model"),
        messages=messages,
        tools=fields.tools(),
        # num_predict -1 (no limit) and -2 (fill the context) set no limit of ours.
        max_tokens=None if max_tokens is None or max_tokens < 0 else max_tokens,
        temperature=options.number("temperature"),
        top_p=options.number("top_p"),
        seed=options.integer("seed"),
        stop=options.stop("stop"),
        json_schema=json_schema,
        json_mode=json_mode,
        assistant_prefix=prefix,
        options=extra,
    )
    # Ollama's last line always carries the counts.
    stream = fields.boolean("stream", default=True)
    return ParsedChat(request=request, stream=stream, include_usage=True)


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
    """Writes an answer's stream chunks as ``/api/chat`` NDJSON lines.

    It also gathers the whole answer, for ``answer``: the single object a client that did not
    stream gets. Durations
    come from ``clock`` (seconds): prompt evaluation up to the first token, evaluation after it.
    """

    __slots__ = ("_chunks", "_clock", "_first_at", "_model", "_started", "_wall_clock")

    def __init__(
        self,
        *,
        model: str,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Answer as ``model``; the request started now."""
        self._model = model
        self._clock = clock
        self._wall_clock = wall_clock
        self._started = clock()
        self._first_at: float | None = None
        self._chunks: list[StreamChunk] = []

    def _message(self, text: str, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
        return message

    def _line(self, message: dict[str, Any], *, done: bool) -> dict[str, Any]:
        return {
            "model": self._model,
            "created_at": _iso(self._wall_clock()),
            "message": message,
            "done": done,
        }

    def feed(self, chunk: StreamChunk) -> list[dict[str, Any]]:
        """Return the lines that carry ``chunk`` (the last one with counts and durations)."""
        self._chunks.append(chunk)
        lines: list[dict[str, Any]] = []
        if chunk.text or chunk.tool_calls:
            if self._first_at is None:
                self._first_at = self._clock()
            lines.append(
                self._line(self._message(chunk.text, chunk.tool_calls), done=False)
            )
        if chunk.done:
            lines.append(self._final(self._message("", ())))
        return lines

    def encode(self, chunk: StreamChunk) -> bytes:
        """Return the NDJSON lines of ``chunk``."""
        return b"".join(ndjson_line(line) for line in self.feed(chunk))

    def answer(self) -> dict[str, Any]:
        """Return the single ``/api/chat`` object of the whole answer fed so far."""
        answer = Answer.of(self._chunks)
        return self._final(self._message(answer.text, answer.tool_calls))

    def _final(self, message: dict[str, Any]) -> dict[str, Any]:
        answer = Answer.of(self._chunks)
        now = self._clock()
        first = self._first_at if self._first_at is not None else now
        line = self._line(message, done=True)
        line["done_reason"] = "length" if answer.finish_reason == "length" else "stop"
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
