"""OpenAI-compatible servers: llama.cpp ``llama-server``, vLLM, LM Studio, LocalAI.

Chat streams ``/v1/chat/completions`` as server-sent events, raw completions
``/v1/completions``; embeddings come from ``/v1/embeddings``. The wire format is
``core.protocols``: the bodies in ``openai_requests``, the events (tool-call assembly, usage) in
``openai_answers``. What differs between servers (where the slot count, metrics and loaded
models come from; how an answer is resumed; vLLM's ``priority``) is chosen here by ``kind``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace
import logging
from typing import Any, Unpack

import aiohttp

from custom_components.llm_lanes.core.backends.base import (
    Backend,
    PrefillStep,
    ServerInfo,
    ServerKind,
    ServerMetrics,
    server_unique_id,
)
from custom_components.llm_lanes.core.backends.prometheus import (
    llama_cpp_metrics,
    parse_samples,
    vllm_metrics,
)
from custom_components.llm_lanes.core.backends.transport import (
    ConnectionOptions,
    HttpClient,
)
from custom_components.llm_lanes.core.errors import BackendError, BackendHTTPError
from custom_components.llm_lanes.core.model import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    StreamChunk,
)
from custom_components.llm_lanes.core.protocols.openai_answers import (
    StreamDecoder,
    embedding_answer,
)
from custom_components.llm_lanes.core.protocols.openai_requests import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    chat_body,
    completion_body,
    embedding_body,
)

_LOGGER = logging.getLogger(__name__)

APPLY_TEMPLATE_PATH = "/apply-template"
COMPLETION_PATH = "/completion"


def server_fields(
    request: ChatRequest, kind: ServerKind, *, send_priority: bool
) -> dict[str, Any]:
    """Return what a kind of server needs in the body beyond the OpenAI format."""
    fields: dict[str, Any] = {}
    if request.assistant_prefix and kind is ServerKind.VLLM:
        # vLLM renders a final assistant message as closed unless told to continue it.
        fields["continue_final_message"] = True
        fields["add_generation_prompt"] = False
    if send_priority and request.priority is not None:
        fields["priority"] = request.priority
    if request.slot is not None and kind is ServerKind.LLAMA_CPP:
        # The slot keeps this prompt cached: the next request placed there reuses its prefix.
        fields["id_slot"] = request.slot
        fields["cache_prompt"] = True
    return fields


class OpenAIBackend(Backend):
    """A client for one OpenAI-compatible server of a known kind."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        kind: ServerKind = ServerKind.OPENAI_COMPATIBLE,
        **options: Unpack[ConnectionOptions],
    ) -> None:
        """Bind the caller's session; ``kind`` picks the server-specific endpoints."""
        if kind is ServerKind.OLLAMA:
            raise ValueError("use OllamaBackend for Ollama's native API")
        self.kind = kind
        self._http = HttpClient(session, base_url, **options)
        self.base_url = self._http.base_url
        self.send_priority = kind is ServerKind.VLLM
        """Whether requests carry ``priority``; turned off when the server refuses it."""
        self.chooses_slots = kind is ServerKind.LLAMA_CPP
        self.prefills_in_steps = kind is ServerKind.LLAMA_CPP

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
        return replace(
            base,
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
        await self._http.load_model(CHAT_PATH, body, model)
        if self.kind is ServerKind.LM_STUDIO:
            return model in (await self.metrics()).loaded_models
        return True

    # --- chat -------------------------------------------------------------------------------

    async def chat(self, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
        """Stream an answer; retry once without ``priority`` if the server refuses it.

        A raw completion streams ``/v1/completions``; embeddings are not streamed: their answer
        comes whole, as two chunks.
        """
        if isinstance(request, EmbeddingRequest):
            for chunk in await self._embed(request):
                yield chunk
            return
        fields = server_fields(request, self.kind, send_priority=self.send_priority)
        body = (
            completion_body(request, fields)
            if isinstance(request, CompletionRequest)
            else chat_body(request, fields)
        )
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

    # --- prefill in steps (llama.cpp) ---------------------------------------------------------

    async def render_prompt(self, request: ChatRequest) -> str:
        """Ask llama.cpp's ``/apply-template`` for the prompt its chat template makes."""
        body = chat_body(request)
        for key in ("stream", "stream_options", "max_tokens"):
            body.pop(key, None)
        data = await self._http.request_json(
            "POST", APPLY_TEMPLATE_PATH, json_body=body, model=request.model
        )
        prompt = data.get("prompt") if isinstance(data, dict) else None
        if not isinstance(prompt, str):
            raise BackendError(f"{self._http.url(APPLY_TEMPLATE_PATH)} gave no prompt")
        return prompt

    async def prefill(self, model: str, text: str, slot: int) -> PrefillStep:
        """Evaluate the start of a prompt into a slot's cache (``/completion``, no output)."""
        data = await self._http.request_json(
            "POST",
            COMPLETION_PATH,
            json_body={
                "prompt": text,
                "n_predict": 0,
                "id_slot": slot,
                "cache_prompt": True,
            },
            timeout_s=self._http.timeouts.first_token_s,
            model=model,
        )
        timings = (data.get("timings") if isinstance(data, dict) else None) or {}
        return PrefillStep(
            evaluated_tokens=int(timings.get("prompt_n") or 0),
            seconds=float(timings.get("prompt_ms") or 0.0) / 1000,
        )

    def _stream(
        self, request: ChatRequest, body: dict[str, Any]
    ) -> AsyncGenerator[StreamChunk]:
        path = COMPLETIONS_PATH if isinstance(request, CompletionRequest) else CHAT_PATH
        decoder = StreamDecoder(request, self._http.url(path))
        return self._http.stream_chunks(path, body, decoder, model=request.model)

    async def _embed(self, request: EmbeddingRequest) -> list[StreamChunk]:
        data = await self._http.request_json(
            "POST",
            EMBEDDINGS_PATH,
            json_body=embedding_body(request),
            model=request.model,
        )
        return embedding_answer(data, request, self._http.url(EMBEDDINGS_PATH))


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
