"""OpenAI-compatible servers: llama.cpp ``llama-server``, vLLM, LM Studio, LocalAI.

Chat streams ``/v1/chat/completions`` as server-sent events, raw completions
``/v1/completions``; embeddings come from ``/v1/embeddings``. The wire format is
``core.protocols``: the bodies in ``openai_requests``, the events (tool-call assembly, usage) in
``openai_answers``. What differs between servers (what requests carry, how an answer is resumed,
where the slot count, metrics and loaded models come from) is the server's description,
``kinds.ServerProfile``: this client reads it and never asks which kind it talks to.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
import logging
from typing import Any

from custom_components.llm_lanes.core.backends.base import PrefillStep, ServerInfo
from custom_components.llm_lanes.core.backends.http_backend import HttpBackend
from custom_components.llm_lanes.core.backends.kinds import (
    ServerKind,
    ServerProfile,
    WireApi,
)
from custom_components.llm_lanes.core.backends.prompt_counts import llama_cpp_rendered
from custom_components.llm_lanes.core.backends.reports import (
    MODELS_PATH,
    llama_cpp_busy_slots,
    merged_facts,
    merged_load,
    models_data,
    served_models,
)
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.core.errors import BackendHTTPError
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

COMPLETION_PATH = "/completion"


def server_fields(
    request: ChatRequest, profile: ServerProfile, *, send_priority: bool
) -> dict[str, Any]:
    """Return what a kind of server needs in the body beyond the OpenAI format."""
    fields: dict[str, Any] = {}
    if request.assistant_prefix:
        fields.update(profile.resume_fields)
    if send_priority and request.priority is not None:
        fields["priority"] = request.priority
    if request.slot is not None and profile.chooses_slots:
        # The slot keeps this prompt cached: the next request placed there reuses its prefix.
        fields["id_slot"] = request.slot
        fields["cache_prompt"] = True
    return fields


class OpenAIBackend(HttpBackend):
    """A client for one OpenAI-compatible server of a known kind."""

    api = WireApi.OPENAI
    api_name = "the OpenAI-compatible API"
    default_kind = ServerKind.OPENAI_COMPATIBLE

    # --- what the server is --------------------------------------------------------------

    async def list_models(self) -> tuple[str, ...]:
        """Models from ``/v1/models``."""
        return await served_models(self._http)

    async def server_info(self) -> ServerInfo:
        """Read what the device shows, from the sources the server's description names."""
        entries = models_data(await self._http.get_json(MODELS_PATH))
        models = tuple(str(model.get("id")) for model in entries)
        facts = merged_facts(
            [await source(self._http, entries) for source in self.profile.info_from]
        )
        prometheus = self.profile.prometheus
        return ServerInfo(
            kind=self.kind,
            version=facts.version,
            models=models,
            loaded_models=(
                facts.loaded_models if facts.loaded_models is not None else models
            ),
            context_length=facts.context_length,
            slots=facts.slots,
            metrics_enabled=(
                prometheus is not None and await prometheus.enabled(self._http)
            ),
            unique_id=self.unique_id,
            model_variants=dict(facts.model_variants or {}),
        )

    # --- live load --------------------------------------------------------------------------

    async def metrics(self) -> ServerMetrics:
        """Read the ``/metrics`` page and the load sources the server's description names."""
        parts: list[ServerMetrics] = []
        if self.profile.prometheus is not None:
            parts.append(await self.profile.prometheus.load(self._http))
        parts.extend([await source(self._http) for source in self.profile.load_from])
        return merged_load(parts)

    async def slots_busy(self) -> int | None:
        """How many slots are processing right now (None where the server does not say)."""
        return (await self.metrics()).slots_busy

    async def busy_slots(self) -> frozenset[int] | None:
        """Return the slots processing now, where the server chooses by ``id_slot`` (llama.cpp)."""
        if not self.profile.chooses_slots:
            return None
        return await llama_cpp_busy_slots(self._http)

    async def warm_up(self, model: str) -> bool:
        """Send a one-token request so the model is loaded (LM Studio loads on demand).

        A server that unloads models is asked whether it holds the model now; the others hold
        every model they serve.
        """
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "stream": False,
        }
        await self._http.load_model(CHAT_PATH, body, model)
        if self.profile.unloads_models:
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
        fields = server_fields(request, self.profile, send_priority=self.send_priority)
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

    # --- the prompt as the server counts it (``counts_prompts``) -------------------------

    async def count_prompt_tokens(self, request: ChatRequest) -> int | None:
        """Count a request's prompt with the server's template and tokenizer (its profile's way).

        A server without the endpoints (404, 405, 501: an older build) is not asked again.
        """
        counter = self.profile.counts_prompts
        if counter is None or not self.counts_prompts:
            return None
        try:
            return await counter(self._http, request, self.profile.resume_fields)
        except BackendHTTPError as err:
            if err.status in _NO_ENDPOINT:
                _LOGGER.info(
                    "%s cannot count prompts (HTTP %s); bounding them instead",
                    self.base_url,
                    err.status,
                )
                self.counts_prompts = False
            raise

    # --- prefill in steps (llama.cpp: ``prefills_in_steps``) -----------------------------

    async def render_prompt(self, request: ChatRequest) -> str:
        """Ask llama.cpp's ``/apply-template`` for the prompt its chat template makes."""
        return await llama_cpp_rendered(self._http, request, {})

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


_NO_ENDPOINT = frozenset({404, 405, 501})
"""Answers of a server that has no such endpoint (501: llama.cpp's for one it was built without)."""


def _refuses_priority(err: BackendHTTPError, body: dict[str, Any]) -> bool:
    """Whether a 400 answers the ``priority`` field (vLLM without priority scheduling)."""
    return err.status == 400 and "priority" in body and "priority" in err.body.lower()
