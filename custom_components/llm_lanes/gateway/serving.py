"""Which server answers a gateway request, what the request becomes on its way there, and the answer.

A client uses its own server entry; a Home Assistant user whichever loaded server serves the
model asked for. The request is checked (server up, model served) before anything is queued,
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

from custom_components.llm_lanes.const import DOMAIN
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
from custom_components.llm_lanes.gateway.auth import Caller
from custom_components.llm_lanes.gateway.http_errors import (
    Wire,
    model_not_found,
    unavailable,
)
from custom_components.llm_lanes.gateway.relay import embeddings_of, relay


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
        self, request: ChatRequest, caller: Caller
    ) -> AsyncGenerator[StreamChunk]:
        """Queue a fitted request in the caller's lane; iterate to run it."""
        return self.runtime.scheduler.stream(
            request,
            lane=caller.lane,
            requester=caller.requester,
            prompt_tokens=estimated_prompt(request),
        )


def _full_name(model: str) -> str:
    return model if ":" in model else f"{model}:latest"


def _loaded(entry: LLMLanesConfigEntry) -> ServingEntry:
    """Return the server of a client's entry (503 when it is not set up or does not answer)."""
    if entry.state is not ConfigEntryState.LOADED:
        raise unavailable(
            f"the LLM server {entry.title!r} is not available ({entry.state.value})"
        )
    server = ServingEntry(entry)
    coordinator = server.runtime.server
    if not coordinator.last_update_success:
        raise unavailable(
            f"the LLM server {entry.title!r} does not answer: "
            f"{coordinator.last_exception or 'unreachable'}"
        )
    return server


def servers_for(hass: HomeAssistant, caller: Caller) -> list[ServingEntry]:
    """Return the servers a caller may use: its client's, or every loaded one (503: none)."""
    if caller.entry is not None:
        return [_loaded(caller.entry)]
    found = [
        ServingEntry(entry)
        for entry in hass.config_entries.async_loaded_entries(DOMAIN)
        if entry.runtime_data.server.last_update_success
    ]
    if not found:
        raise unavailable("no LLM server is available")
    return found


def server_for(
    hass: HomeAssistant, caller: Caller, model: str
) -> tuple[ServingEntry, str]:
    """Return the server that answers a request for ``model``, and its name (404: none)."""
    for server in servers_for(hass, caller):
        if (name := server.served_model(model)) is not None:
            return server, name
    raise model_not_found(model)


def fit(
    request: ChatRequest,
    caller: Caller,
    server: ServingEntry,
    model: str,
    *,
    ollama_client: bool,
) -> ChatRequest:
    """Fit a client's request to its caller and its server.

    A request without an output limit gets the client's (or, with none, the lane's default);
    one with a limit is capped by the client's and the lane's, as a server caps it at its
    context: the answer ends with ``length`` rather than being refused.
    """
    lane_limit = server.runtime.scheduler.settings.lanes[caller.lane].max_output_tokens
    limits = [
        limit
        for limit in (request.max_tokens, caller.max_output_tokens)
        if limit is not None
    ]
    max_tokens = min([*limits, lane_limit]) if limits else None
    same_format = server.speaks_ollama == ollama_client
    return replace(
        request,
        model=model,
        max_tokens=max_tokens,
        options=client_options(request.options, same_format=same_format),
    )


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
    server, model = server_for(request.app[KEY_HASS], caller, parsed.request.model)
    fitted = fit(parsed.request, caller, server, model, ollama_client=ollama_client)
    return await relay(
        request,
        server.stream(fitted, caller),
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
    server, model = server_for(request.app[KEY_HASS], caller, parsed.request.model)
    fitted = fit(parsed.request, caller, server, model, ollama_client=ollama_client)
    return await embeddings_of(server.stream(fitted, caller))
