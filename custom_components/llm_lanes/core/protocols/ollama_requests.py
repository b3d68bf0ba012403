"""Ollama's request bodies, both directions.

Chat (``/api/chat``), raw completions and one-turn chats (``/api/generate``), embeddings
(``/api/embed``) and a model's description (``/api/show``). The backend writes them:
``chat_body``, ``generate_body`` (a raw completion) and ``embed_body``, sampling settings in
``options``. The gateway reads a client's: ``parse_chat``, ``parse_generate`` and
``parse_embed`` (``keep_alive`` and ``think`` travel in ``ChatRequest.options``, and go back to
the top level of a body).

Ollama carries no tool call ids in requests: parsed calls are numbered ``call_0``, ``call_1`` ...
through the conversation, and a tool result names its tool instead.
"""

from __future__ import annotations

from typing import Any

from custom_components.llm_lanes.core.errors import InvalidRequestError
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    ToolCall,
)
from custom_components.llm_lanes.core.protocols.common import (
    ParsedChat,
    ParsedEmbeddings,
    sampling_to_wire,
    split_prefix,
    tools_to_wire,
)
from custom_components.llm_lanes.core.protocols.fields import Fields
from custom_components.llm_lanes.core.protocols.schemas import check_schema

CHAT_PATH = "/api/chat"
GENERATE_PATH = "/api/generate"
EMBED_PATH = "/api/embed"
SHOW_PATH = "/api/show"
TOP_LEVEL_OPTIONS = ("keep_alive", "think", "truncate", "dimensions")
"""Request options that Ollama takes at the top level of the body, not in ``options``.

``keep_alive`` and ``think`` (chat, generate), ``truncate`` and ``dimensions`` (embed)."""
_SAMPLING_OPTIONS = frozenset({"num_predict", "temperature", "top_p", "seed", "stop"})
"""Ollama ``options`` that are fields of ``ChatRequest`` (the others pass through)."""


# --- written by the backend --------------------------------------------------------------------


def message_to_wire(message: ChatMessage) -> dict[str, Any]:
    """Convert a message to Ollama's shape (tool call arguments are objects, not strings)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [tool_call_to_wire(call) for call in message.tool_calls]
    if message.role == "tool" and message.name:
        data["tool_name"] = message.name
    return data


def tool_call_to_wire(call: ToolCall) -> dict[str, Any]:
    """Write a tool call as a request carries it: no id, its arguments as an object."""
    return {"function": {"name": call.name, "arguments": call.arguments}}


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


# --- read by the gateway -----------------------------------------------------------------------


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
        return check_schema(raw, "format"), False
    raise InvalidRequestError("format", 'must be "json" or a JSON schema')
