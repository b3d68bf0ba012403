"""Tell LLM servers apart from a base URL alone, and build the right client for one.

Each probe asks an endpoint only one kind of server has:

1. Ollama: ``/api/version`` and ``/api/tags``.
2. llama.cpp: ``/props`` with ``total_slots`` or ``default_generation_settings``.
3. vLLM: ``/v1/models`` entries ``owned_by: "vllm"``, or ``vllm:`` series at ``/metrics``.
4. LM Studio: ``/api/v0/models`` entries with a ``state`` (loaded / not-loaded).
5. LocalAI: ``/system`` listing its ``backends``.
6. Anything else answering ``/v1/models``: a generic OpenAI-compatible server.
"""

from __future__ import annotations

from typing import Unpack

import aiohttp

from custom_components.llm_lanes.core.backends.base import Backend, ServerKind
from custom_components.llm_lanes.core.backends.ollama import OllamaBackend
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.backends.transport import (
    ConnectionOptions,
    HttpClient,
)
from custom_components.llm_lanes.core.errors import (
    AuthError,
    BackendConnectionError,
    BackendError,
    BackendTimeoutError,
)


async def _probe_json(http: HttpClient, path: str) -> object | None:
    """GET a JSON document; None when the server has no such endpoint (or answers non-JSON).

    Connection failures, timeouts and refused keys are not "no such endpoint": they propagate.
    """
    try:
        document: object = await http.get_json(path)
    except BackendConnectionError, BackendTimeoutError, AuthError:
        raise
    except BackendError:
        return None
    return document


async def detect_server_kind(
    session: aiohttp.ClientSession, base_url: str, **options: Unpack[ConnectionOptions]
) -> ServerKind:
    """Find out which kind of server answers at ``base_url``."""
    http = HttpClient(session, base_url, **options)
    version = await _probe_json(http, "/api/version")
    if isinstance(version, dict) and "version" in version:
        tags = await _probe_json(http, "/api/tags")
        if isinstance(tags, dict) and "models" in tags:
            return ServerKind.OLLAMA
    props = await _probe_json(http, "/props")
    if isinstance(props, dict) and (
        "total_slots" in props or "default_generation_settings" in props
    ):
        return ServerKind.LLAMA_CPP
    models = await _probe_json(http, "/v1/models")
    entries = models.get("data") if isinstance(models, dict) else None
    if isinstance(entries, list) and any(
        isinstance(entry, dict) and entry.get("owned_by") == "vllm" for entry in entries
    ):
        return ServerKind.VLLM
    if isinstance(entries, list):
        try:
            metrics = await http.request_text("GET", "/metrics")
        except BackendConnectionError, BackendTimeoutError, AuthError:
            raise
        except BackendError:
            metrics = ""
        if "vllm:" in metrics:
            return ServerKind.VLLM
    lm_models = await _probe_json(http, "/api/v0/models")
    lm_entries = lm_models.get("data") if isinstance(lm_models, dict) else None
    if isinstance(lm_entries, list) and any(
        isinstance(entry, dict) and "state" in entry for entry in lm_entries
    ):
        return ServerKind.LM_STUDIO
    system = await _probe_json(http, "/system")
    if isinstance(system, dict) and "backends" in system:
        return ServerKind.LOCALAI
    if isinstance(entries, list):
        return ServerKind.OPENAI_COMPATIBLE
    raise BackendConnectionError(
        f"no Ollama or OpenAI-compatible LLM server answers at {http.base_url}",
        url=http.base_url,
    )


def create_backend(
    session: aiohttp.ClientSession,
    base_url: str,
    kind: ServerKind,
    **options: Unpack[ConnectionOptions],
) -> Backend:
    """Build the client for a server of a known kind."""
    if kind is ServerKind.OLLAMA:
        return OllamaBackend(session, base_url, **options)
    return OpenAIBackend(session, base_url, kind=kind, **options)


async def connect(
    session: aiohttp.ClientSession, base_url: str, **options: Unpack[ConnectionOptions]
) -> Backend:
    """Detect the server at ``base_url`` and return the client for it."""
    kind = await detect_server_kind(session, base_url, **options)
    return create_backend(session, base_url, kind, **options)
