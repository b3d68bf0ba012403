"""What the OpenAI and Ollama wire formats share.

Function tools, tool calls, the resume prefix, and reading a client's fields. The readers raise ``InvalidRequestError`` naming the field (``messages[2].role``), so a server can
answer 400 with a message that says what to fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
import json
from typing import Any, Literal, Protocol, cast

from ..backends.base import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    TokenUsage,
    ToolCall,
    ToolSpec,
)
from ..errors import InvalidRequestError, MalformedStreamError, StreamClosedError
from ..tokens import estimate_prompt_tokens

type Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ParsedChat:
    """A chat request a client sent, and how it wants the answer delivered."""

    request: ChatRequest
    stream: bool
    """Stream the answer (SSE / NDJSON) rather than send one object at the end."""
    include_usage: bool = False
    """OpenAI ``stream_options.include_usage``: end the stream with a usage event."""


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


def estimated_usage(request: ChatRequest, output_tokens: int) -> TokenUsage:
    """Return the usage of an answer whose server gave no counts.

    The prompt is estimated as the scheduler's admission estimates it; the output is what streamed.
    """
    return TokenUsage(estimate_prompt_tokens(request), output_tokens, "estimate")


def stream_closed(url: str) -> StreamClosedError:
    """Return the error of a stream that ended before the server said it was done."""
    return StreamClosedError(
        f"the server at {url} closed the stream before it was done", url=url
    )


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


def tools_from_wire(raw: Any, where: str = "tools") -> tuple[ToolSpec, ...]:
    """Read a client's function tools."""
    tools: list[ToolSpec] = []
    for index, item in enumerate(as_list(raw, where)):
        place = f"{where}[{index}]"
        tool = as_object(item, place)
        if tool.get("type", "function") != "function":
            raise InvalidRequestError(
                path(place, "type"), "only function tools are supported"
            )
        function = as_object(tool.get("function"), path(place, "function"))
        tools.append(
            ToolSpec(
                name=string(function, "name", path(place, "function")),
                description=string(
                    function, "description", path(place, "function"), default=""
                ),
                parameters=as_object(
                    function.get("parameters", {}), f"{place}.function.parameters"
                ),
            )
        )
    return tuple(tools)


def json_object(arguments: Any) -> dict[str, Any] | None:
    """Return tool call arguments as an object: given as one, or as JSON text ("" is {})."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments.strip() or "{}")
        except ValueError:
            return None
    return arguments if isinstance(arguments, dict) else None


def tool_calls_from_wire(
    raw: Any, where: str, *, first_index: int = 0
) -> tuple[ToolCall, ...]:
    """Read the tool calls of a client's message (arguments as an object or JSON text).

    A call without an id is numbered ``call_<n>``, counting from ``first_index``.
    """
    calls: list[ToolCall] = []
    for index, item in enumerate(as_list(raw, where)):
        place = f"{where}[{index}]"
        call = as_object(item, place)
        function = as_object(call.get("function"), path(place, "function"))
        arguments = json_object(function.get("arguments", {}))
        if arguments is None:
            raise InvalidRequestError(
                f"{place}.function.arguments", "must be a JSON object"
            )
        calls.append(
            ToolCall(
                id=string(call, "id", place, default=f"call_{first_index + index}"),
                name=string(function, "name", path(place, "function")),
                arguments=arguments,
            )
        )
    return tuple(calls)


def text_content(content: Any, where: str) -> str:
    """Read a message's text: a string, null, or a list of text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[str] = []
    for index, item in enumerate(as_list(content, where)):
        part = as_object(item, f"{where}[{index}]")
        if part.get("type") != "text":
            raise InvalidRequestError(
                f"{where}[{index}].type", "only text parts are supported"
            )
        parts.append(string(part, "text", f"{where}[{index}]"))
    return "".join(parts)


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


def path(where: str, key: str) -> str:
    """Name a field of the object at ``where`` (``""`` for the request itself)."""
    return f"{where}.{key}" if where else key


def as_object(value: Any, where: str) -> dict[str, Any]:
    """Return ``value`` if it is a JSON object."""
    if not isinstance(value, dict):
        raise InvalidRequestError(where, "must be an object")
    return value


def optional_object(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    """Read an object field of the request (absent or null reads as an empty one)."""
    value = obj.get(key)
    return {} if value is None else as_object(value, key)


def as_list(value: Any, where: str) -> list[Any]:
    """Return ``value`` if it is a JSON list (None reads as an empty one)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequestError(where, "must be a list")
    return value


def string(
    obj: Mapping[str, Any], key: str, where: str, *, default: str | None = None
) -> str:
    """Read a string field (required unless it has a default)."""
    value = obj.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise InvalidRequestError(path(where, key), "must be a string")
    return value


def role(obj: Mapping[str, Any], where: str) -> Role:
    """Read a message's role."""
    value = string(obj, "role", where)
    for known in ROLES:
        if value == known:
            return known
    raise InvalidRequestError(path(where, "role"), f"must be one of {', '.join(ROLES)}")


def boolean(obj: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
    """Read a true/false field."""
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise InvalidRequestError(path(where, key), "must be true or false")
    return value


def integer(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    """Read an optional whole number."""
    value = _numeric(obj, key, where, int, "must be a whole number")
    return None if value is None else int(value)


def number(obj: Mapping[str, Any], key: str, where: str) -> float | None:
    """Read an optional number."""
    value = _numeric(obj, key, where, int | float, "must be a number")
    return None if value is None else float(value)


def _numeric(
    obj: Mapping[str, Any], key: str, where: str, kind: Any, problem: str
) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    # JSON's true and false are not numbers, though Python's bool is an int.
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InvalidRequestError(path(where, key), problem)
    return cast("float", value)


def stop_words(obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    """Read stop sequences: one string or a list of them."""
    value = obj.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise InvalidRequestError(path(where, key), "must be a string or a list of strings")
