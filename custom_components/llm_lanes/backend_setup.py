"""Finds out what server sits behind a URL and builds its client (for set-up and the flows)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import ClientError, ClientSession, ClientTimeout
from yarl import URL

from custom_components.llm_lanes.core.backends.base import Backend, ServerInfo
from custom_components.llm_lanes.core.backends.detect import (
    create_backend,
    detect_server_kind,
)
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.errors import BackendConnectionError

ANSWER_TIMEOUT = ClientTimeout(total=10)


class InvalidURLError(ValueError):
    """The text is not an http(s) URL with a host."""


class UnsupportedServerError(Exception):
    """Something answers HTTP at the URL, but no supported LLM server."""


@dataclass(frozen=True, slots=True)
class ProbedServer:
    """A server that answered: its kind, a client for it and what it said about itself."""

    kind: ServerKind
    backend: Backend
    info: ServerInfo


OPENAI_PREFIX = "/v1"
"""The path of an OpenAI-compatible API: part of the requests, not of the server's base URL."""


def normalize_url(text: str) -> str:
    """Return the base URL, without a trailing slash or ``/v1``; raise ``InvalidURLError``.

    An OpenAI-compatible server's docs give its API as ``http://host:port/v1``; the clients add
    ``/v1`` themselves, so the server's base URL (and its identity) is the same without it.
    """
    try:
        url = URL(text.strip())
    except ValueError as err:
        raise InvalidURLError(text) from err
    if url.scheme not in {"http", "https"} or not url.host:
        raise InvalidURLError(text)
    path = url.path.rstrip("/")
    if path.endswith(OPENAI_PREFIX):
        url = url.with_path(path.removesuffix(OPENAI_PREFIX) or "/")
    return str(url).rstrip("/")


def build_backend(
    session: ClientSession, kind: ServerKind, url: str, api_key: str | None
) -> Backend:
    """Build the client for a server of a known kind."""
    return create_backend(session, url, kind, api_key=api_key or None)


async def _answers_http(session: ClientSession, url: str) -> bool:
    """Tell whether anything answers HTTP at ``url`` (whatever the status)."""
    try:
        async with session.get(url, timeout=ANSWER_TIMEOUT, allow_redirects=False):
            return True
    except ClientError, TimeoutError:
        return False


async def probe_server(
    session: ClientSession, url: str, api_key: str | None
) -> ProbedServer:
    """Detect the server kind and ask the server what it serves.

    Raises ``UnsupportedServerError`` when an HTTP server answers but is no LLM server we know,
    and the engine's ``BackendError`` subclasses (connection, auth) otherwise.
    """
    try:
        kind = await detect_server_kind(session, url, api_key=api_key or None)
    except BackendConnectionError:
        if await _answers_http(session, url):
            raise UnsupportedServerError(url) from None
        raise
    backend = build_backend(session, kind, url, api_key)
    return ProbedServer(kind=kind, backend=backend, info=await backend.server_info())
