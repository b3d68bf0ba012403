"""Ollama's native API: ``/api/chat`` streamed as NDJSON, ``/api/ps`` for what is loaded."""

from __future__ import annotations

from collections.abc import AsyncGenerator
import json
import logging
from typing import Any

import aiohttp

from ..errors import BackendError, MalformedStreamError, StreamClosedError
from ..tokens import estimate_prompt_tokens
from .base import (
    Backend,
    BackendTimeouts,
    ChatMessage,
    ChatRequest,
    ServerInfo,
    ServerKind,
    ServerMetrics,
    StreamChunk,
    TokenUsage,
    ToolCall,
    server_unique_id,
)
from .transport import HttpClient, http_error

_LOGGER = logging.getLogger(__name__)

KEEP_ALIVE_FOREVER = -1
"""Ollama ``keep_alive`` that keeps a model resident until the server stops."""


def ollama_message(message: ChatMessage) -> dict[str, Any]:
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


def ollama_chat_body(
    request: ChatRequest, keep_alive: int | str | None
) -> dict[str, Any]:
    """Build the ``/api/chat`` body for a request."""
    messages = [ollama_message(message) for message in request.messages]
    if request.assistant_prefix:
        # Ollama continues a final assistant message instead of starting a new one.
        messages.append({"role": "assistant", "content": request.assistant_prefix})
    options: dict[str, Any] = {}
    if request.max_tokens is not None:
        options["num_predict"] = request.max_tokens
    if request.temperature is not None:
        options["temperature"] = request.temperature
    if request.top_p is not None:
        options["top_p"] = request.top_p
    if request.seed is not None:
        options["seed"] = request.seed
    if request.stop:
        options["stop"] = list(request.stop)
    options.update(request.options)
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "stream": True,
        "options": options,
    }
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in request.tools
        ]
    if request.json_schema is not None:
        body["format"] = request.json_schema
    return body


def _tool_calls(message: dict[str, Any], first_index: int) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    for offset, raw in enumerate(message.get("tool_calls") or ()):
        function = raw.get("function") or {}
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as err:
                raise MalformedStreamError(
                    f"tool call arguments are not JSON: {arguments[:80]!r}"
                ) from err
        calls.append(
            ToolCall(
                id=str(raw.get("id") or f"call_{first_index + offset}"),
                name=str(function.get("name", "")),
                arguments=dict(arguments),
            )
        )
    return tuple(calls)


class OllamaBackend(Backend):
    """A client for one Ollama server."""

    kind = ServerKind.OLLAMA

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        timeouts: BackendTimeouts | None = None,
        api_key: str | None = None,
        keep_alive: int | str | None = KEEP_ALIVE_FOREVER,
    ) -> None:
        """Bind the caller's session; ``keep_alive`` is sent with every request."""
        self._http = HttpClient(session, base_url, timeouts=timeouts, api_key=api_key)
        self.base_url = self._http.base_url
        self.keep_alive = keep_alive

    async def server_info(self) -> ServerInfo:
        """Read version, installed models and loaded models."""
        version = await self._http.get_json("/api/version")
        models = await self.list_models()
        loaded, context = await self._loaded()
        return ServerInfo(
            kind=self.kind,
            version=str(version.get("version")) if isinstance(version, dict) else None,
            models=models,
            loaded_models=loaded,
            context_length=context,
            slots=None,
            metrics_enabled=False,
            unique_id=server_unique_id(self.kind, self.base_url),
        )

    async def list_models(self) -> tuple[str, ...]:
        """Installed models (``/api/tags``)."""
        data = await self._http.get_json("/api/tags")
        return tuple(
            str(model.get("name") or model.get("model"))
            for model in (data.get("models") or () if isinstance(data, dict) else ())
        )

    async def _loaded(self) -> tuple[tuple[str, ...], int | None]:
        data = await self._http.get_json("/api/ps")
        models = data.get("models") or () if isinstance(data, dict) else ()
        names = tuple(str(model.get("name") or model.get("model")) for model in models)
        contexts = [int(m["context_length"]) for m in models if m.get("context_length")]
        return names, (max(contexts) if contexts else None)

    async def metrics(self) -> ServerMetrics:
        """Ollama only says which models are loaded (``/api/ps``)."""
        loaded, _ = await self._loaded()
        return ServerMetrics(loaded_models=loaded)

    async def warm_up(self, model: str) -> bool:
        """Load the model with an empty chat and keep it resident; report whether it is loaded."""
        body: dict[str, Any] = {"model": model, "messages": [], "stream": False}
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        await self._http.request_json(
            "POST",
            "/api/chat",
            json_body=body,
            timeout_s=self._http.timeouts.warm_up_s,
            model=model,
        )
        loaded, _ = await self._loaded()
        return any(_same_model(name, model) for name in loaded)

    async def chat(self, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
        """Stream ``/api/chat``; each NDJSON line with text is one token."""
        body = ollama_chat_body(request, self.keep_alive)
        url = self._http.url("/api/chat")
        output_tokens = 0
        tool_index = 0
        async with self._http.stream_lines(
            "/api/chat", body, model=request.model
        ) as lines:
            async for line in lines:
                try:
                    data = json.loads(line)
                except ValueError as err:
                    raise MalformedStreamError(
                        f"{url} sent a line that is not JSON: {line[:80]!r}", url=url
                    ) from err
                if not isinstance(data, dict):
                    raise MalformedStreamError(
                        f"{url} sent a line that is not an object: {line[:80]!r}",
                        url=url,
                    )
                if "error" in data:
                    raise _stream_error(str(data["error"]), url, request.model)
                message = data.get("message") or {}
                text = str(message.get("content") or "")
                calls = _tool_calls(message, tool_index)
                tool_index += len(calls)
                if text or calls:
                    lines.token_seen()
                if data.get("done"):
                    if text or calls:
                        output_tokens += 1 if text else 0
                        yield StreamChunk(
                            text=text, output_tokens=1 if text else 0, tool_calls=calls
                        )
                    yield StreamChunk(
                        done=True,
                        finish_reason=_finish_reason(data, tool_index),
                        usage=_usage(data, request, output_tokens),
                    )
                    return
                if text or calls:
                    tokens = 1 if text else 0
                    output_tokens += tokens
                    yield StreamChunk(text=text, output_tokens=tokens, tool_calls=calls)
        raise StreamClosedError(
            f"the server at {url} closed the stream before it was done", url=url
        )


def _finish_reason(data: dict[str, Any], tool_calls: int) -> str:
    if tool_calls:
        return "tool_calls"
    return str(data.get("done_reason") or "stop")


def _usage(
    data: dict[str, Any], request: ChatRequest, streamed_tokens: int
) -> TokenUsage:
    prompt = data.get("prompt_eval_count")
    output = data.get("eval_count")
    if isinstance(output, int):
        # A cached prompt can leave prompt_eval_count out; the estimate fills only that gap.
        return TokenUsage(
            prompt_tokens=int(prompt)
            if isinstance(prompt, int)
            else estimate_prompt_tokens(request),
            output_tokens=output,
            source="server",
        )
    return TokenUsage(
        prompt_tokens=estimate_prompt_tokens(request),
        output_tokens=streamed_tokens,
        source="estimate",
    )


def _stream_error(message: str, url: str, model: str) -> BackendError:
    """Type an error reported inside the stream like the HTTP error it stands for."""
    lowered = message.lower()
    status = 500
    if "not found" in lowered and "model" in lowered:
        status = 404
    elif "busy" in lowered or "too many" in lowered:
        status = 503
    return http_error(status, json.dumps({"error": message}), url=url, model=model)


def _same_model(loaded: str, wanted: str) -> bool:
    """Ollama names default to the ``latest`` tag."""

    def full(name: str) -> str:
        return name if ":" in name else f"{name}:latest"

    return full(loaded) == full(wanted)
