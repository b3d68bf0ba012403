"""Tell LLM servers apart from a base URL alone, and build the right client for one.

Each kind's description (``kinds.ServerProfile.detection``) says which endpoints only that kind
has and what they answer; the kinds are tried in ``kinds.SERVER_PROFILES``' order (Ollama,
llama.cpp, vLLM, LM Studio, LocalAI, then anything answering ``/v1/models`` as a generic
OpenAI-compatible server), and each endpoint is asked once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

import aiohttp

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.backends.http_backend import HttpBackend
from custom_components.llm_lanes.core.backends.kinds import (
    SERVER_PROFILES,
    ServerKind,
    ServerProfile,
    server_profile,
)
from custom_components.llm_lanes.core.backends.ollama import OllamaBackend
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.backends.probes import Evidence, Probe
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

CLIENTS: tuple[type[HttpBackend], ...] = (OllamaBackend, OpenAIBackend)
"""One client per API a server may speak (``HttpBackend.api``)."""


class _Answers:
    """The answers of one server to the probes, each endpoint asked once."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http
        self._answers: dict[tuple[str, bool], Any] = {}

    async def answer(self, probe: Probe) -> Any:
        """GET the probe's endpoint (JSON or text); None when the server has no such endpoint.

        Connection failures, timeouts and refused keys are not "no such endpoint": they
        propagate.
        """
        key = (probe.path, probe.match.reads_text)
        if key not in self._answers:
            self._answers[key] = await self._fetch(*key)
        return self._answers[key]

    async def _fetch(self, path: str, as_text: bool) -> Any:
        try:
            if as_text:
                return await self._http.request_text("GET", path)
            return await self._http.get_json(path)
        except BackendConnectionError, BackendTimeoutError, AuthError:
            raise
        except BackendError:
            return None

    async def show(self, evidence: Evidence) -> bool:
        """Tell whether every probe of the evidence matches (asked in order, until one fails)."""
        for probe in evidence:
            if not probe.match.matches(await self.answer(probe)):
                return False
        return True


async def detect_server(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    profiles: Sequence[ServerProfile] = SERVER_PROFILES,
    **options: Unpack[ConnectionOptions],
) -> ServerProfile:
    """Return the description of the server at ``base_url``: the first of ``profiles`` it shows."""
    http = HttpClient(session, base_url, **options)
    answers = _Answers(http)
    for profile in profiles:
        for evidence in profile.detection:
            if await answers.show(evidence):
                return profile
    raise BackendConnectionError(
        f"no Ollama or OpenAI-compatible LLM server answers at {http.base_url}",
        url=http.base_url,
    )


async def detect_server_kind(
    session: aiohttp.ClientSession, base_url: str, **options: Unpack[ConnectionOptions]
) -> ServerKind:
    """Find out which kind of server answers at ``base_url``."""
    return (await detect_server(session, base_url, **options)).kind


def create_backend(
    session: aiohttp.ClientSession,
    base_url: str,
    kind: ServerKind | ServerProfile,
    **options: Unpack[ConnectionOptions],
) -> Backend:
    """Build the client for a server of a known kind: the one of the API it speaks."""
    profile = server_profile(kind)
    client = next(client for client in CLIENTS if client.api is profile.api)
    return client(session, base_url, kind=profile, **options)


async def connect(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    profiles: Sequence[ServerProfile] = SERVER_PROFILES,
    **options: Unpack[ConnectionOptions],
) -> Backend:
    """Detect the server at ``base_url`` (among ``profiles``) and return the client for it."""
    profile = await detect_server(session, base_url, profiles=profiles, **options)
    return create_backend(session, base_url, profile, **options)
