"""OpenAI-compatible servers: llama.cpp ``llama-server``, vLLM, LM Studio, LocalAI.

Chat streams ``/v1/chat/completions`` as server-sent events with ``include_usage``; tool calls
arrive in pieces keyed by index and are assembled before the final chunk. What differs between
servers (where the slot count, metrics and loaded models come from; how an answer is resumed;
vLLM's ``priority``) is chosen by ``kind``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
import json
import logging
from typing import Any

import aiohttp

from ..errors import (
    BackendError,
    BackendHTTPError,
    MalformedStreamError,
    StreamClosedError,
)
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
from .prometheus import llama_cpp_metrics, parse_samples, vllm_metrics
from .transport import HttpClient, http_error

_LOGGER = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"


def openai_message(message: ChatMessage) -> dict[str, Any]:
    """Convert a message to the OpenAI shape (tool call arguments as JSON strings)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments),
                },
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        if message.tool_call_id:
            data["tool_call_id"] = message.tool_call_id
        if message.name:
            data["name"] = message.name
    return data


def openai_chat_body(
    request: ChatRequest, kind: ServerKind, *, send_priority: bool
) -> dict[str, Any]:
    """Build the ``/v1/chat/completions`` body for a request."""
    messages = [openai_message(message) for message in request.messages]
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.assistant_prefix:
        messages.append({"role": "assistant", "content": request.assistant_prefix})
        if kind is ServerKind.VLLM:
            # vLLM renders a final assistant message as closed unless told to continue it.
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stop:
        body["stop"] = list(request.stop)
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
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": "response",
                "schema": request.json_schema,
                "strict": True,
            },
        }
    if send_priority and request.priority is not None:
        body["priority"] = request.priority
    body.update(request.options)
    return body


@dataclass(slots=True)
class _PartialToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _StreamState:
    """What one SSE stream has said so far."""

    request: ChatRequest
    url: str
    streamed_tokens: int = 0
    finish_reason: str | None = None
    usage: TokenUsage | None = None
    tool_calls: dict[int, _PartialToolCall] = field(default_factory=dict)
    echo: str | None = None
    """The resume prefix while we still watch for the server echoing it (llama.cpp streams a
    prefilled answer back before the new text); None once decided."""
    held: str = ""
    held_tokens: int = 0

    def __post_init__(self) -> None:
        self.echo = self.request.assistant_prefix or None

    def new_text(self, text: str) -> tuple[str, int]:
        """Return the text of a delta (one token) the caller should see, and its token count.

        While the stream may still be echoing the resume prefix, deltas are held back; an exact
        echo is dropped, anything else is released as it came.
        """
        if self.echo is None:
            return text, 1
        self.held += text
        self.held_tokens += 1
        if self.held.startswith(self.echo):
            rest = self.held[len(self.echo) :]
            self.echo = None
            return rest, 1 if rest else 0
        if self.echo.startswith(self.held):
            return "", 0
        self.echo = None
        return self.held, self.held_tokens

    def add_tool_call_pieces(self, pieces: list[dict[str, Any]]) -> None:
        for piece in pieces:
            index = int(piece.get("index", len(self.tool_calls)))
            call = self.tool_calls.setdefault(index, _PartialToolCall())
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

    def assembled_tool_calls(self) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for index in sorted(self.tool_calls):
            partial = self.tool_calls[index]
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

    def final_usage(self) -> TokenUsage:
        if self.usage is not None:
            return self.usage
        return TokenUsage(
            prompt_tokens=estimate_prompt_tokens(self.request),
            output_tokens=self.streamed_tokens,
            source="estimate",
        )


def _usage_from(data: dict[str, Any]) -> TokenUsage | None:
    usage = data.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return TokenUsage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage["completion_tokens"]),
            source="server",
        )
    timings = data.get("timings")  # llama.cpp, also without include_usage
    if isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
        return TokenUsage(
            prompt_tokens=int(timings.get("prompt_n") or 0)
            + int(timings.get("cache_n") or 0),
            output_tokens=int(timings["predicted_n"]),
            source="server",
        )
    return None


class OpenAIBackend(Backend):
    """A client for one OpenAI-compatible server of a known kind."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        kind: ServerKind = ServerKind.OPENAI_COMPATIBLE,
        timeouts: BackendTimeouts | None = None,
        api_key: str | None = None,
    ) -> None:
        """Bind the caller's session; ``kind`` picks the server-specific endpoints."""
        if kind is ServerKind.OLLAMA:
            raise ValueError("use OllamaBackend for Ollama's native API")
        self.kind = kind
        self._http = HttpClient(session, base_url, timeouts=timeouts, api_key=api_key)
        self.base_url = self._http.base_url
        self.send_priority = kind is ServerKind.VLLM
        """Whether requests carry ``priority``; turned off when the server refuses it."""

    # --- what the server is --------------------------------------------------------------

    async def list_models(self) -> tuple[str, ...]:
        """Models from ``/v1/models``."""
        data = await self._http.get_json("/v1/models")
        return tuple(str(model.get("id")) for model in _models_data(data))

    async def server_info(self) -> ServerInfo:
        """Read what the device shows, from the endpoints this kind of server has."""
        models_data = _models_data(await self._http.get_json("/v1/models"))
        models = tuple(str(model.get("id")) for model in models_data)
        version: str | None = None
        loaded: tuple[str, ...] = models
        context: int | None = None
        slots: int | None = None
        metrics_enabled = False
        if self.kind is ServerKind.LLAMA_CPP:
            props = await self._http.get_json("/props")
            settings = props.get("default_generation_settings") or {}
            context = _int_or_none(settings.get("n_ctx") or props.get("n_ctx"))
            slots = _int_or_none(props.get("total_slots"))
            version = props.get("build_info") or None
            metrics_enabled = await self._has_metrics()
        elif self.kind is ServerKind.VLLM:
            version = await self._version()
            lengths = [
                m["max_model_len"] for m in models_data if m.get("max_model_len")
            ]
            context = _int_or_none(max(lengths)) if lengths else None
            metrics_enabled = await self._has_metrics()
        elif self.kind is ServerKind.LM_STUDIO:
            lm_models = _models_data(await self._http.get_json("/api/v0/models"))
            loaded = tuple(
                str(m.get("id")) for m in lm_models if m.get("state") == "loaded"
            )
            lengths = [
                m.get("loaded_context_length") or m.get("max_context_length")
                for m in lm_models
                if m.get("state") == "loaded"
            ]
            context = _int_or_none(max(lengths)) if lengths and all(lengths) else None
        elif self.kind is ServerKind.LOCALAI:
            version = await self._version()
        return ServerInfo(
            kind=self.kind,
            version=version,
            models=models,
            loaded_models=loaded,
            context_length=context,
            slots=slots,
            metrics_enabled=metrics_enabled,
            unique_id=server_unique_id(self.kind, self.base_url),
        )

    async def _version(self) -> str | None:
        try:
            data = await self._http.get_json("/version")
        except BackendError:
            return None
        return (
            str(data["version"])
            if isinstance(data, dict) and "version" in data
            else None
        )

    async def _has_metrics(self) -> bool:
        try:
            await self._http.request_text("GET", "/metrics")
        except BackendHTTPError:
            return False  # llama.cpp answers 501 without --metrics
        return True

    # --- live load --------------------------------------------------------------------------

    async def metrics(self) -> ServerMetrics:
        """llama.cpp: ``/slots`` and ``/metrics``; vLLM: ``/metrics``; others: loaded models."""
        if self.kind is ServerKind.VLLM:
            return vllm_metrics(
                parse_samples(await self._http.request_text("GET", "/metrics"))
            )
        if self.kind is ServerKind.LLAMA_CPP:
            return await self._llama_cpp_metrics()
        if self.kind is ServerKind.LM_STUDIO:
            lm_models = _models_data(await self._http.get_json("/api/v0/models"))
            return ServerMetrics(
                loaded_models=tuple(
                    str(m.get("id")) for m in lm_models if m.get("state") == "loaded"
                )
            )
        return ServerMetrics(loaded_models=await self.list_models())

    async def _llama_cpp_metrics(self) -> ServerMetrics:
        base = ServerMetrics()
        try:
            base = llama_cpp_metrics(
                parse_samples(await self._http.request_text("GET", "/metrics"))
            )
        except BackendHTTPError as err:
            if err.status != 501:
                raise
        slots_total: int | None = None
        slots_busy: int | None = None
        try:
            slots = await self._http.get_json("/slots")
        except BackendHTTPError as err:
            if err.status != 501:  # started without --slots
                raise
        else:
            if isinstance(slots, list):
                slots_total = len(slots)
                slots_busy = sum(1 for slot in slots if slot_is_busy(slot))
        return ServerMetrics(
            requests_running=base.requests_running,
            requests_waiting=base.requests_waiting,
            kv_cache_usage=base.kv_cache_usage,
            prompt_tokens_total=base.prompt_tokens_total,
            output_tokens_total=base.output_tokens_total,
            slots_total=slots_total,
            slots_busy=slots_busy,
            loaded_models=await self.list_models(),
        )

    async def slots_busy(self) -> int | None:
        """How many llama.cpp slots are processing right now (None where unknown)."""
        return (await self._llama_cpp_metrics()).slots_busy

    async def warm_up(self, model: str) -> bool:
        """Send a one-token request so the model is loaded (LM Studio loads on demand)."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "stream": False,
        }
        await self._http.request_json(
            "POST",
            CHAT_PATH,
            json_body=body,
            timeout_s=self._http.timeouts.warm_up_s,
            model=model,
        )
        if self.kind is ServerKind.LM_STUDIO:
            return model in (await self.metrics()).loaded_models
        return True

    # --- chat -------------------------------------------------------------------------------

    async def chat(self, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
        """Stream an answer; retry once without ``priority`` if the server refuses it."""
        body = openai_chat_body(request, self.kind, send_priority=self.send_priority)
        yielded = False
        try:
            # aclosing: when the caller closes this stream, the inner one (and so the
            # connection) is closed at once, not when the garbage collector gets to it.
            async with aclosing(self._stream(request, body)) as stream:
                async for chunk in stream:
                    yielded = True
                    yield chunk
        except BackendHTTPError as err:
            if yielded or not _refuses_priority(err, body):
                raise
            _LOGGER.info(
                "%s does not take request priorities; no longer sending them",
                self.base_url,
            )
            self.send_priority = False
            body.pop("priority")
            async with aclosing(self._stream(request, body)) as stream:
                async for chunk in stream:
                    yield chunk

    async def _stream(
        self, request: ChatRequest, body: dict[str, Any]
    ) -> AsyncGenerator[StreamChunk]:
        url = self._http.url(CHAT_PATH)
        state = _StreamState(request=request, url=url)
        async with self._http.stream_lines(
            CHAT_PATH, body, model=request.model
        ) as lines:
            async for raw in lines:
                data = _sse_data(raw, url)
                if data is None:
                    continue
                if isinstance(data, str):  # "[DONE]"
                    yield self._final(state)
                    return
                chunks = self._chunks(data, state)
                if state.streamed_tokens or state.held_tokens or state.tool_calls:
                    lines.token_seen()
                for chunk in chunks:
                    yield chunk
        if state.finish_reason is None:
            raise StreamClosedError(
                f"the server at {url} closed the stream before it was done", url=url
            )
        yield self._final(state)

    def _chunks(self, data: dict[str, Any], state: _StreamState) -> list[StreamChunk]:
        if "error" in data:
            raise _stream_error(data, state.url, state.request.model)
        usage = _usage_from(data)
        if usage is not None:
            state.usage = usage
        chunks: list[StreamChunk] = []
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            if delta.get("tool_calls"):
                state.add_tool_call_pieces(delta["tool_calls"])
            if text:
                # One delta is one token on llama.cpp, vLLM and LM Studio.
                shown, tokens = state.new_text(str(text))
                state.streamed_tokens += tokens
                if shown or tokens:
                    chunks.append(StreamChunk(text=shown, output_tokens=tokens))
            elif reasoning:
                # Reasoning tokens cost the same as answer tokens but carry no answer text.
                state.streamed_tokens += 1
                chunks.append(StreamChunk(output_tokens=1))
            elif delta.get("tool_calls"):
                state.streamed_tokens += 1
            if choice.get("finish_reason"):
                state.finish_reason = str(choice["finish_reason"])
        return chunks

    def _final(self, state: _StreamState) -> StreamChunk:
        calls = state.assembled_tool_calls()
        reason = state.finish_reason or "stop"
        if calls and reason == "stop":
            reason = "tool_calls"
        return StreamChunk(
            tool_calls=calls, done=True, finish_reason=reason, usage=state.final_usage()
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
        try:
            data = json.loads(payload)
        except ValueError as err:
            raise MalformedStreamError(
                f"{url} sent an event that is not JSON: {payload[:80]!r}", url=url
            ) from err
        if not isinstance(data, dict):
            raise MalformedStreamError(
                f"{url} sent an event that is not an object", url=url
            )
        if field_name == "error" and "error" not in data:
            data = {"error": data}
        return data
    raise MalformedStreamError(
        f"{url} sent a line that is not a server-sent event: {line[:80]!r}", url=url
    )


def _stream_error(data: dict[str, Any], url: str, model: str) -> BackendError:
    error = data["error"]
    status = 500
    if isinstance(error, dict):
        code = error.get("code")
        if isinstance(code, int):
            status = code
    return http_error(status, json.dumps(data), url=url, model=model)


def _refuses_priority(err: BackendHTTPError, body: dict[str, Any]) -> bool:
    """Whether a 400 answers the ``priority`` field (vLLM without priority scheduling)."""
    return err.status == 400 and "priority" in body and "priority" in err.body.lower()


def slot_is_busy(slot: dict[str, Any]) -> bool:
    """Whether a llama.cpp ``/slots`` entry is processing (``state`` in older builds)."""
    if "is_processing" in slot:
        return bool(slot["is_processing"])
    return bool(slot.get("state", 0))


def _models_data(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return [model for model in data["data"] if isinstance(model, dict)]
    return []


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except TypeError, ValueError:
        return None
