"""Ollama's native API: ``/api/chat`` streamed as NDJSON, ``/api/ps`` for what is loaded.

Raw completions stream ``/api/generate`` (``raw``), embeddings come from ``/api/embed`` and a
model's description from ``/api/show``. The wire format is ``core.protocols``:
the bodies in ``ollama_requests``, the lines (tool calls, counts) in ``ollama_answers``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, Unpack

import aiohttp

from custom_components.llm_lanes.core.backends.base import ServerInfo
from custom_components.llm_lanes.core.backends.http_backend import HttpBackend
from custom_components.llm_lanes.core.backends.kinds import (
    ServerKind,
    ServerProfile,
    WireApi,
)
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.core.backends.transport import ConnectionOptions
from custom_components.llm_lanes.core.model import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    StreamChunk,
)
from custom_components.llm_lanes.core.protocols.ollama_answers import (
    StreamDecoder,
    embed_answer,
)
from custom_components.llm_lanes.core.protocols.ollama_requests import (
    CHAT_PATH,
    EMBED_PATH,
    GENERATE_PATH,
    SHOW_PATH,
    chat_body,
    embed_body,
    generate_body,
)

KEEP_ALIVE_FOREVER = -1
"""Ollama ``keep_alive`` that keeps a model resident until the server stops."""


class OllamaBackend(HttpBackend):
    """A client for one Ollama server."""

    api = WireApi.OLLAMA
    api_name = "Ollama's native API"
    default_kind = ServerKind.OLLAMA

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        kind: ServerKind | ServerProfile | None = None,
        keep_alive: int | str | None = KEEP_ALIVE_FOREVER,
        **options: Unpack[ConnectionOptions],
    ) -> None:
        """Bind the caller's session; ``keep_alive`` is sent with every request."""
        super().__init__(session, base_url, kind=kind, **options)
        self.keep_alive = keep_alive

    async def server_info(self) -> ServerInfo:
        """Read version, installed models and loaded models."""
        version = await self._http.get_json("/api/version")
        models = await self.list_models()
        resident = await self._resident()
        loaded, context = _names_and_context(resident)
        return ServerInfo(
            kind=self.kind,
            version=str(version.get("version")) if isinstance(version, dict) else None,
            models=models,
            loaded_models=loaded,
            context_length=context,
            unique_id=self.unique_id,
            model_variants={
                _name(model): _variant(model)
                for model in resident
                if model.get("digest")
            },
        )

    async def list_models(self) -> tuple[str, ...]:
        """Installed models (``/api/tags``)."""
        data = await self._http.get_json("/api/tags")
        return tuple(
            str(model.get("name") or model.get("model"))
            for model in (data.get("models") or () if isinstance(data, dict) else ())
        )

    async def _resident(self) -> list[dict[str, Any]]:
        """Read the entries of ``/api/ps``: the models loaded now."""
        data = await self._http.get_json("/api/ps")
        models = data.get("models") or () if isinstance(data, dict) else ()
        return [model for model in models if isinstance(model, dict)]

    async def _loaded(self) -> tuple[tuple[str, ...], int | None]:
        return _names_and_context(await self._resident())

    async def metrics(self) -> ServerMetrics:
        """Ollama only says which models are loaded (``/api/ps``)."""
        loaded, _ = await self._loaded()
        return ServerMetrics(loaded_models=loaded)

    async def warm_up(self, model: str) -> bool:
        """Load the model with an empty chat and keep it resident; report whether it is loaded."""
        body: dict[str, Any] = {"model": model, "messages": [], "stream": False}
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        await self._http.load_model(CHAT_PATH, body, model)
        loaded, _ = await self._loaded()
        return any(_same_model(name, model) for name in loaded)

    async def chat(self, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
        """Stream ``/api/chat`` (``/api/generate`` for a raw completion); a line is one token.

        Embeddings are not streamed: their answer comes whole, as two chunks.
        """
        if isinstance(request, EmbeddingRequest):
            for chunk in await self._embed(request):
                yield chunk
            return
        path = CHAT_PATH
        body = chat_body(request, self.keep_alive)
        if isinstance(request, CompletionRequest):
            path, body = GENERATE_PATH, generate_body(request, self.keep_alive)
        decoder = StreamDecoder(request, self._http.url(path))
        # aclosing: closing this stream closes the connection at once (see OpenAIBackend.chat).
        async with aclosing(
            self._http.stream_chunks(path, body, decoder, model=request.model)
        ) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _embed(self, request: EmbeddingRequest) -> list[StreamChunk]:
        data = await self._http.request_json(
            "POST",
            EMBED_PATH,
            json_body=embed_body(request, self.keep_alive),
            model=request.model,
        )
        return embed_answer(data, request, self._http.url(EMBED_PATH))

    async def model_details(self, model: str) -> dict[str, Any] | None:
        """Return Ollama's own ``/api/show`` document of ``model``."""
        data = await self._http.request_json(
            "POST", SHOW_PATH, json_body={"model": model}, model=model
        )
        return data if isinstance(data, dict) else None


def _name(model: dict[str, Any]) -> str:
    return str(model.get("name") or model.get("model"))


def _names_and_context(
    resident: list[dict[str, Any]],
) -> tuple[tuple[str, ...], int | None]:
    """Return the loaded models' names and the largest context they were loaded with."""
    contexts = [int(m["context_length"]) for m in resident if m.get("context_length")]
    return tuple(_name(model) for model in resident), (
        max(contexts) if contexts else None
    )


def _variant(model: dict[str, Any]) -> str:
    """Say what a loaded model is beyond its name: its digest and quantization."""
    details = model.get("details")
    quantization = (
        details.get("quantization_level") if isinstance(details, dict) else None
    )
    digest = str(model["digest"])[:12]
    return f"{digest} {quantization}" if quantization else digest


def _same_model(loaded: str, wanted: str) -> bool:
    """Ollama names default to the ``latest`` tag."""

    def full(name: str) -> str:
        return name if ":" in name else f"{name}:latest"

    return full(loaded) == full(wanted)
