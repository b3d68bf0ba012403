"""What a new server entry is called and holds, unless the user says otherwise.

Names carry the server's host, so that two servers of the same kind and model, their agents and
their entity ids can be told apart: the entry "llama.cpp on 192.168.1.20 (qwen3:8b)"; its agent and
AI Task entity are subentries named after the server, "llama.cpp on 192.168.1.20" (their devices'
names), whose entities say what they are, translated: "Conversation", "AI Task"
(``conversation.llama_cpp_on_192_168_1_20_conversation``); a subentry the user named is named
that alone. The config flow and
``scripts/develop``'s seeding build new entries with these; titles the user gave stay.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from homeassistant.config_entries import ConfigSubentryData
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm
from homeassistant.util import slugify

from custom_components.llm_lanes.const import (
    CONF_LLM_HASS_API,
    CONF_MODEL,
    DOMAIN,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.core.backends.kinds import ServerKind, server_profile

NAMED_SUBENTRY_TYPES: frozenset[str] = frozenset(
    {SUBENTRY_CONVERSATION, SUBENTRY_AI_TASK}
)
"""Subentries named after their server by default (a new one's title, a moved server's)."""
LEGACY_SUBENTRY_SUFFIXES: dict[str, str] = {
    SUBENTRY_CONVERSATION: "conversation",
    SUBENTRY_AI_TASK: "AI Task",
}
"""What the default titles of entries made before minor version 2 added to the server's name."""
AGENT_OBJECT_ID_NAME = "Conversation"
"""The English name of an agent's entity (``entity.conversation.conversation``), which its
entity id is made of."""


def _host(url: str) -> str:
    return (urlsplit(url).hostname or url).lower()


def _address(url: str) -> str:
    parts = urlsplit(url)
    return f"{_host(url)}:{parts.port}" if parts.port else _host(url)


def server_name(kind: ServerKind, url: str, other_urls: Iterable[str] = ()) -> str:
    """Name the server by its kind and host, e.g. "llama.cpp on 192.168.1.20".

    The port joins the host when another configured server (``other_urls``) runs on that host.
    """
    shared_host = any(_host(other) == _host(url) for other in other_urls)
    return (
        f"{server_profile(kind).name} on {_address(url) if shared_host else _host(url)}"
    )


def other_server_urls(hass: HomeAssistant, entry_id: str | None = None) -> list[str]:
    """Return the URLs of the servers but ``entry_id`` (names show the port on a shared host)."""
    return [
        other.data[CONF_URL]
        for other in hass.config_entries.async_entries(DOMAIN, include_ignore=False)
        if other.entry_id != entry_id and CONF_URL in other.data
    ]


def default_names(kind: ServerKind, url: str) -> tuple[str, str]:
    """Return the names a new entry for ``url`` may have been given (without, with the port)."""
    return server_name(kind, url), server_name(kind, url, [url])


def entry_title(name: str, model: str) -> str:
    """Title a server entry (and its device): its name and the model it serves."""
    return f"{name} ({model})"


def subentry_name(subentry_type: str, name: str) -> str:
    """Name a new agent or AI Task entity (its device) after its server, e.g. "llama.cpp on nas".

    Its entity adds what it is ("Conversation", "AI Task", in the user's language).
    """
    return name


def legacy_subentry_titles(
    subentry_type: str, kind: ServerKind, url: str
) -> dict[str, str]:
    """Map the default titles of a subentry of the server at ``url`` before 1.2 to their names.

    Such a title was the server's name (with or without the port) and a suffix.
    """
    suffix = LEGACY_SUBENTRY_SUFFIXES[subentry_type]
    return {f"{name} {suffix}": name for name in default_names(kind, url)}


def default_agent_entity_id(name: str) -> str:
    """Return the entity id a new server named ``name`` gives its agent (none taken before)."""
    return f"conversation.{slugify(f'{name} {AGENT_OBJECT_ID_NAME}')}"


def default_subentries(name: str, model: str) -> list[ConfigSubentryData]:
    """Describe a new server's conversation agent (with the Assist API) and AI Task entity."""
    return [
        ConfigSubentryData(
            subentry_type=SUBENTRY_CONVERSATION,
            data={CONF_MODEL: model, CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]},
            title=subentry_name(SUBENTRY_CONVERSATION, name),
            unique_id=None,
        ),
        ConfigSubentryData(
            subentry_type=SUBENTRY_AI_TASK,
            data={CONF_MODEL: model},
            title=subentry_name(SUBENTRY_AI_TASK, name),
            unique_id=None,
        ),
    ]
