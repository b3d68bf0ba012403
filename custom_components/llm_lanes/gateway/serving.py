"""Which server answers a gateway request, what the request becomes on its way there, and the answer.

A client uses its own server entry; a Home Assistant user whichever loaded server serves the
model asked for; a client of the pool (``Caller.pool``) the household's pool, which routes each
request over every loaded server (its entry's model stands for each server's own model, so a
request for it may run on any of them). The request is checked (server up, model served) before anything is queued,
then fitted to its caller: the output limit capped by the client's and the lane's, the options
limited to what may reach that kind of server (``core.protocols.common.client_options``), and
queued in the caller's lane, charged to its requester. ``async_answer`` and ``async_embed`` do
all of that for one parsed request of either API.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, replace

from aiohttp import web
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.helpers.http import KEY_HASS

from custom_components.llm_lanes.const import CONF_MODEL, DOMAIN
from custom_components.llm_lanes.coordinator import (
    LLMLanesConfigEntry,
    LLMLanesRuntimeData,
)
from custom_components.llm_lanes.core.backends.base import ServerInfo
from custom_components.llm_lanes.core.backends.kinds import WireApi
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk, TokenUsage
from custom_components.llm_lanes.core.protocols.common import (
    ParsedChat,
    ParsedEmbeddings,
    StreamEncoder,
    client_options,
    estimated_prompt,
)
from custom_components.llm_lanes.core.router import ANY_MODEL
from custom_components.llm_lanes.gateway.auth import Caller
from custom_components.llm_lanes.gateway.http_errors import (
    Wire,
    model_not_found,
    unavailable,
)
from custom_components.llm_lanes.gateway.relay import embeddings_of, relay
from custom_components.llm_lanes.household import household_of


@dataclass(frozen=True, slots=True)
class ServingEntry:
    """A loaded server entry that answers gateway requests."""

    entry: LLMLanesConfigEntry

    @property
    def runtime(self) -> LLMLanesRuntimeData:
        """What the loaded entry holds."""
        return self.entry.runtime_data

    @property
    def info(self) -> ServerInfo | None:
        """What the server said at the last successful poll."""
        data = self.runtime.server.data
        return data.info if data is not None else None

    @property
    def models(self) -> tuple[str, ...]:
        """The models the server serves."""
        info = self.info
        return info.models if info is not None else ()

    @property
    def speaks_ollama(self) -> bool:
        """Whether the server behind speaks Ollama's native API (else the OpenAI-compatible one)."""
        return self.runtime.backend.profile.api is WireApi.OLLAMA

    def served_model(self, model: str) -> str | None:
        """Return the server's name of ``model`` if it serves it (``name`` is ``name:latest``)."""
        for name in self.models:
            if _full_name(name) == _full_name(model):
                return name
        return None

    def stream(
        self, hass: HomeAssistant, request: ChatRequest, caller: Caller
    ) -> AsyncGenerator[StreamChunk]:
        """Queue a fitted request in the caller's lane (in the pool for its client); iterate to run it."""
        if caller.pool:
            return household_of(hass).stream(
                request,
                lane=caller.lane,
                requester=caller.requester,
                prompt_tokens=estimated_prompt(request),
            )
        return self.runtime.scheduler.stream(
            request,
            lane=caller.lane,
            requester=caller.requester,
            prompt_tokens=estimated_prompt(request),
        )


def _full_name(model: str) -> str:
    return model if ":" in model else f"{model}:latest"


def _loaded(entry: LLMLanesConfigEntry, *, answering: bool = True) -> ServingEntry:
    """Return the server of a client's entry (503 when it is not set up or does not answer).

    A client of the pool (``answering`` False) may use a server that does not answer now.
    """
    if entry.state is not ConfigEntryState.LOADED:
        raise unavailable(
            f"the LLM server {entry.title!r} is not available ({entry.state.value})"
        )
    server = ServingEntry(entry)
    coordinator = server.runtime.server
    if answering and not coordinator.last_update_success:
        # Not the poll's error: it names the server's address (the repair and log say it).
        raise unavailable(
            f"the LLM server {entry.title!r} does not answer; try again later "
            "(Home Assistant's repairs and log say why)"
        )
    return server


def servers_for(hass: HomeAssistant, caller: Caller) -> list[ServingEntry]:
    """Return the servers a caller may use: its client's, or every loaded one (503: none).

    A client of the pool may use its own and every other loaded server that answers.
    """
    if caller.entry is not None and not caller.pool:
        return [_loaded(caller.entry)]
    own = [_loaded(caller.entry, answering=False)] if caller.entry is not None else []
    found = own + [
        ServingEntry(entry)
        for entry in hass.config_entries.async_loaded_entries(DOMAIN)
        if entry.runtime_data.server.last_update_success and entry is not caller.entry
    ]
    if not found:
        raise unavailable("no LLM server is available")
    return found


def server_for(
    hass: HomeAssistant, caller: Caller, model: str
) -> tuple[ServingEntry, str]:
    """Return the server that answers a request for ``model``, and its name (404: none).

    For a client of the pool, its entry's model is each server's own (``ANY_MODEL``).
    """
    servers = servers_for(hass, caller)
    if caller.pool and caller.entry is not None:
        own = caller.entry.data[CONF_MODEL]
        if _full_name(model) == _full_name(own):
            return servers[0], ANY_MODEL
    for server in servers:
        if (name := server.served_model(model)) is not None:
            return server, name
    raise model_not_found(model)


def _pool_members(hass: HomeAssistant, caller: Caller) -> list[ServingEntry]:
    """Return the servers a request of a client of the pool may reach (none for the others)."""
    if not caller.pool:
        return []
    return [ServingEntry(entry) for entry in household_of(hass).members]


def fit(
    request: ChatRequest,
    caller: Caller,
    server: ServingEntry,
    model: str,
    *,
    ollama_client: bool,
    pool_members: Sequence[ServingEntry] = (),
) -> ChatRequest:
    """Fit a client's request to its caller and its server.

    A request without an output limit gets the client's (or, with none, the lane's default);
    one with a limit is capped by the client's and the lane's, as a server caps it at its
    context: the answer ends with ``length`` rather than being refused. A client of the pool
    may reach any of ``pool_members``: its options pass as they would to each of them.
    """
    lane_limit = server.runtime.scheduler.settings.lanes[caller.lane].max_output_tokens
    limits = [
        limit
        for limit in (request.max_tokens, caller.max_output_tokens)
        if limit is not None
    ]
    max_tokens = min([*limits, lane_limit]) if limits else None
    same_format = all(
        member.speaks_ollama == ollama_client for member in (server, *pool_members)
    )
    return replace(
        request,
        model=model,
        max_tokens=max_tokens,
        options=client_options(request.options, same_format=same_format),
    )


def _queued(
    request: web.Request,
    caller: Caller,
    chat: ChatRequest,
    *,
    ollama_client: bool,
) -> AsyncGenerator[StreamChunk]:
    """Check a client's request (404, 503 raised here), fit it and queue it; iterate to run it."""
    hass = request.app[KEY_HASS]
    server, model = server_for(hass, caller, chat.model)
    fitted = fit(
        chat,
        caller,
        server,
        model,
        ollama_client=ollama_client,
        pool_members=_pool_members(hass, caller),
    )
    return server.stream(hass, fitted, caller)


async def async_answer(
    request: web.Request,
    caller: Caller,
    parsed: ParsedChat,
    encoder: Callable[[], StreamEncoder],
    *,
    wire: Wire,
    ollama_client: bool,
) -> web.StreamResponse:
    """Answer a parsed chat or completion request through its server's scheduler."""
    return await relay(
        request,
        _queued(request, caller, parsed.request, ollama_client=ollama_client),
        encoder=encoder(),
        stream=parsed.stream,
        wire=wire,
    )


async def async_embed(
    request: web.Request,
    caller: Caller,
    parsed: ParsedEmbeddings,
    *,
    ollama_client: bool,
) -> tuple[tuple[Sequence[float], ...], TokenUsage | None]:
    """Run a parsed embeddings request through its server's scheduler."""
    return await embeddings_of(
        _queued(request, caller, parsed.request, ollama_client=ollama_client)
    )
