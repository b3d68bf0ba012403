"""Gateway clients: the client subentries of a server entry, their keys and base URLs.

A client is an app outside Home Assistant (Open WebUI, a phone app, a script, Home Assistant's
own ``ollama`` or ``llama_cpp`` integration) with its own key, lane and requester
(``client:<subentry id>``). The key is stored in the subentry's data under ``api_key``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
import hmac
from ipaddress import ip_address
import secrets
from typing import Final

from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import CONF_API_KEY
from homeassistant.core import HomeAssistant
from homeassistant.helpers.network import NoURLAvailableError, get_url
from yarl import URL

from custom_components.llm_lanes.const import (
    CONF_LANE,
    CONF_MAX_OUTPUT_TOKENS,
    CONF_POOL,
    CONF_QUOTA_TOKENS_PER_DAY,
    DOMAIN,
    SUBENTRY_CLIENT,
)
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.requesters import client_requester

KEY_BYTES: Final = 32
"""Random bytes in a client key (43 URL-safe characters)."""
OPENAI_PATH: Final = "/api/llm_lanes/v1"
"""Base path of the OpenAI-compatible endpoint (``Authorization: Bearer <client key>``)."""
OLLAMA_PATH: Final = "/api/llm_lanes/ollama"
"""Base path of the Ollama-compatible endpoint; the client key follows it in the URL."""
PLACEHOLDER_URL: Final = "http://<home-assistant>:8123"
"""Shown in the base URLs when Home Assistant knows no URL of its own."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Client:
    """One client subentry, as the gateway applies it."""

    subentry_id: str
    name: str
    lane: Lane
    quota_tokens_per_day: int
    """0: the server's default quota applies."""
    max_output_tokens: int | None
    """The most output tokens one of its requests may produce (None: the lane's limit)."""
    pool: bool = False
    """Its requests go to the household's pool, not to its server alone."""

    @property
    def requester(self) -> str:
        """Who its tokens are charged to."""
        return client_requester(self.subentry_id)

    @classmethod
    def of(cls, subentry: ConfigSubentry) -> Client:
        """Read a client subentry."""
        data = subentry.data
        max_output = int(data.get(CONF_MAX_OUTPUT_TOKENS) or 0)
        return cls(
            subentry_id=subentry.subentry_id,
            name=subentry.title,
            lane=Lane.from_key(data[CONF_LANE]),
            quota_tokens_per_day=int(data.get(CONF_QUOTA_TOKENS_PER_DAY) or 0),
            max_output_tokens=max_output or None,
            pool=bool(data.get(CONF_POOL)),
        )


def new_api_key() -> str:
    """Generate a client key."""
    return secrets.token_urlsafe(KEY_BYTES)


def client_subentries(entry: LLMLanesConfigEntry) -> Iterator[ConfigSubentry]:
    """Iterate over the client subentries of a server entry."""
    return (
        subentry
        for subentry in entry.subentries.values()
        if subentry.subentry_type == SUBENTRY_CLIENT
    )


def client_quotas(entry: LLMLanesConfigEntry) -> dict[str, int]:
    """Return the daily token quotas the entry's clients set, by requester."""
    clients = (Client.of(subentry) for subentry in client_subentries(entry))
    return {
        client.requester: client.quota_tokens_per_day
        for client in clients
        if client.quota_tokens_per_day > 0
    }


def find_client(
    hass: HomeAssistant, api_key: str
) -> tuple[LLMLanesConfigEntry, Client] | None:
    """Find the client a key belongs to, among the clients of every server entry.

    Every stored key is compared, in constant time, whatever matched before: how long this
    takes tells nothing about the keys. Entries that are not loaded (their server was down at
    start-up) are searched too, so their clients get "unavailable" rather than "unauthorized".
    """
    given = api_key.encode()
    found: tuple[LLMLanesConfigEntry, ConfigSubentry] | None = None
    for entry in hass.config_entries.async_entries(DOMAIN):
        for subentry in client_subentries(entry):
            stored = str(subentry.data.get(CONF_API_KEY, "")).encode()
            if hmac.compare_digest(given, stored) and stored:
                found = (entry, subentry)
    if found is None:
        return None
    return found[0], Client.of(found[1])


def home_assistant_url(hass: HomeAssistant) -> str:
    """Return the URL the household's apps reach Home Assistant at, as Home Assistant knows it.

    Its internal URL (*Settings → System → Network*) first; else, when Home Assistant listens on
    one address only (``server_host``, e.g. ``127.0.0.1``), that address, since the LAN address
    it detected for itself would not answer; else what ``get_url`` finds (the detected LAN
    address, then the external URL); ``PLACEHOLDER_URL`` when it knows none.
    """
    api = hass.config.api
    if not hass.config.internal_url and api is not None and _one_address(api.host):
        scheme = "https" if api.use_ssl else "http"
        return str(URL.build(scheme=scheme, host=api.host, port=api.port))
    try:
        return get_url(hass, allow_ip=True, prefer_external=False)
    except NoURLAvailableError:
        return PLACEHOLDER_URL


def _one_address(host: str) -> bool:
    """Whether Home Assistant binds to this one address rather than to every one (``0.0.0.0``)."""
    try:
        return not ip_address(host).is_unspecified
    except ValueError:  # a host name
        return True


def base_urls(hass: HomeAssistant, api_key: str) -> dict[str, str]:
    """Return the base URLs a client is given: OpenAI's (key in a header), Ollama's (key in it)."""
    host = home_assistant_url(hass)
    return {
        "openai_url": f"{host}{OPENAI_PATH}",
        "ollama_url": f"{host}{OLLAMA_PATH}/{api_key}",
    }


def key_placeholders(hass: HomeAssistant, api_key: str) -> dict[str, str]:
    """Return what the flows show of a new key: the key and the two base URLs."""
    return {"api_key": api_key, **base_urls(hass, api_key)}
