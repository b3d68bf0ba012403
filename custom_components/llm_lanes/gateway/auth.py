"""Who is calling the gateway: a client by its key, or a Home Assistant user by an access token.

A request without a valid key is refused before anything is read or queued, and reported to
Home Assistant's login-attempt ban (``http`` ``ip_ban_enabled``) as a wrong password is. Keys
are never logged: the URL the ban logs has the Ollama endpoint's key replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import hdrs, web
from homeassistant.components.http.ban import process_success_login, process_wrong_login
from homeassistant.components.http.const import KEY_HASS_USER
from homeassistant.helpers.http import KEY_AUTHENTICATED, KEY_HASS

from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.gateway.clients import OLLAMA_PATH, find_client
from custom_components.llm_lanes.gateway.http_errors import unauthorized
from custom_components.llm_lanes.requesters import user_requester

REDACTED = "**REDACTED**"


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who a request is for: its requester, lane and output cap, and the server it may use."""

    requester: str
    lane: Lane
    max_output_tokens: int | None = None
    entry: LLMLanesConfigEntry | None = None
    """The client's server entry; None for a Home Assistant user (whichever serves the model)."""
    pool: bool = False
    """A client of the household's pool: routed over every server, its entry's being one."""


def bearer_key(request: web.Request) -> str | None:
    """Read the key of an ``Authorization: Bearer <key>`` header."""
    scheme, _, key = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


async def async_authenticate(
    request: web.Request, api_key: str | None, *, users: bool
) -> Caller:
    """Return the caller of ``request``, or raise the 401 (and count a failed login).

    ``users``: whether a Home Assistant access token is accepted (Home Assistant's own auth
    middleware has checked it already); its user is charged, in the interactive lane.
    """
    if users and request.get(KEY_AUTHENTICATED):
        user = request[KEY_HASS_USER]
        return Caller(requester=user_requester(user.id), lane=Lane.INTERACTIVE)
    found = find_client(request.app[KEY_HASS], api_key) if api_key else None
    if found is None:
        await process_wrong_login(_without_key(request))
        raise unauthorized(ollama=not users)
    process_success_login(request)
    entry, client = found
    return Caller(
        requester=client.requester,
        lane=client.lane,
        max_output_tokens=client.max_output_tokens,
        entry=entry,
        pool=client.pool,
    )


def _without_key(request: web.Request) -> web.Request:
    """Hide the key of an Ollama endpoint URL in a copy of the request (the ban logs the URL)."""
    path = request.rel_url.path
    if not path.startswith(f"{OLLAMA_PATH}/"):
        return request
    _, _, rest = path.removeprefix(f"{OLLAMA_PATH}/").partition("/")
    return request.clone(rel_url=f"{OLLAMA_PATH}/{REDACTED}/{rest}".rstrip("/"))
