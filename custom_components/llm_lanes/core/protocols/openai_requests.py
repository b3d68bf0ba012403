"""OpenAI's request bodies, both directions.

Chat (``/v1/chat/completions``), raw completions (``/v1/completions``) and embeddings
(``/v1/embeddings``). The backend writes them: ``chat_body`` and ``completion_body`` build
streamed requests with ``include_usage``, ``embedding_body`` an embeddings one. The gateway
reads a client's: ``parse_chat``, ``parse_completion`` and ``parse_embeddings`` (a final
assistant message is the beginning of the answer, continued as llama.cpp does).
"""

from __future__ import annotations

from collections.abc import Mapping
import json
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
from custom_components.llm_lanes.core.protocols.schemas import (
    check_schema,
    check_tool_choice,
)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"

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


# --- written by the backend --------------------------------------------------------------------


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


# --- read by the gateway -----------------------------------------------------------------------


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
    tools = fields.tools()
    check_tool_choice(fields.get("tool_choice"), tools, "tool_choice")
    request = ChatRequest(
        model=fields.string("model"),
        messages=messages,
        tools=tools,
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
        return check_schema(spec.get("schema"), spec.name("schema")), False
    if kind not in {"text", "json_object"}:
        raise InvalidRequestError(
            fields.name("type"), "must be text, json_object or json_schema"
        )
    return None, kind == "json_object"
