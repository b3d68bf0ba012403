"""The Ollama-compatible endpoint: host URL ``/api/llm_lanes/ollama/<client key>``.

For clients that cannot send a header (Home Assistant's own ``ollama`` integration among them)
the key is part of the host URL. Under it: ``/`` ("Ollama is running"), ``/api/version``,
``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/chat``, ``/api/generate`` and ``/api/embed``,
whatever the server behind (requests and streams are translated by ``core.protocols``).
"""

from __future__ import annotations

import time
from typing import Final

from aiohttp import web
from homeassistant.helpers.http import KEY_HASS, HomeAssistantView

from custom_components.llm_lanes.core.model import StreamChunk
from custom_components.llm_lanes.core.protocols import ollama_answers, ollama_requests
from custom_components.llm_lanes.core.protocols.common import ParsedChat
from custom_components.llm_lanes.core.protocols.fields import Fields
from custom_components.llm_lanes.gateway.auth import Caller, async_authenticate
from custom_components.llm_lanes.gateway.clients import OLLAMA_PATH
from custom_components.llm_lanes.gateway.http_errors import OLLAMA_WIRE
from custom_components.llm_lanes.gateway.relay import Handler, read_json, serve
from custom_components.llm_lanes.gateway.serving import (
    ServingEntry,
    async_answer,
    async_embed,
    server_for,
    servers_for,
)

API_VERSION: Final = "0.12.6"
"""The Ollama version reported when the server behind is not Ollama (its API is served)."""


class OllamaView(HomeAssistantView):
    """Every path under an Ollama-compatible host URL."""

    url = f"{OLLAMA_PATH}/{{key}}/api/{{endpoint}}"
    extra_urls = [f"{OLLAMA_PATH}/{{key}}", f"{OLLAMA_PATH}/{{key}}/"]  # noqa: RUF012
    name = "api:llm_lanes:ollama"
    requires_auth = False
    """The client key in the URL is checked here."""

    async def get(
        self, request: web.Request, key: str, endpoint: str = ""
    ) -> web.StreamResponse:
        """Answer ``GET /`` and ``GET /api/<endpoint>``."""
        return await _async_serve(request, key, "GET", endpoint)

    async def post(
        self, request: web.Request, key: str, endpoint: str = ""
    ) -> web.StreamResponse:
        """Answer ``POST /api/<endpoint>``."""
        return await _async_serve(request, key, "POST", endpoint)


async def _async_serve(
    request: web.Request, key: str, method: str, endpoint: str
) -> web.StreamResponse:
    return await serve(
        request,
        OLLAMA_WIRE,
        lambda: async_authenticate(request, key, users=False),
        _ROUTES.get((method, endpoint)),
        f"/api/{endpoint}",
    )


def _server(request: web.Request, caller: Caller) -> ServingEntry:
    return servers_for(request.app[KEY_HASS], caller)[0]


async def _root(request: web.Request, caller: Caller) -> web.Response:
    return web.Response(text="Ollama is running")


async def _version(request: web.Request, caller: Caller) -> web.Response:
    server = _server(request, caller)
    info = server.info
    version = info.version if server.speaks_ollama and info is not None else None
    return web.json_response({"version": version or API_VERSION})


async def _tags(request: web.Request, caller: Caller) -> web.Response:
    return web.json_response(
        ollama_answers.tags_to_wire(_server(request, caller).models)
    )


async def _ps(request: web.Request, caller: Caller) -> web.Response:
    info = _server(request, caller).info
    loaded = info.loaded_models if info is not None else ()
    context = info.context_length if info is not None else None
    return web.json_response(ollama_answers.ps_to_wire(loaded, context))


async def _show(request: web.Request, caller: Caller) -> web.Response:
    body = await read_json(request)
    if isinstance(body, dict) and "model" not in body:
        body = {**body, "model": body.get("name")}  # the older name of the field
    wanted = Fields(body).string("model")
    server, model = server_for(request.app[KEY_HASS], caller, wanted)
    details = await server.runtime.backend.model_details(model)
    if details is None:
        info = server.info
        details = ollama_answers.show_to_wire(
            info.context_length if info is not None else None
        )
    return web.json_response(details)


async def _chat(request: web.Request, caller: Caller) -> web.StreamResponse:
    return await _generate(
        request, caller, ollama_requests.parse_chat(await read_json(request))
    )


async def _generate_route(request: web.Request, caller: Caller) -> web.StreamResponse:
    parsed = ollama_requests.parse_generate(await read_json(request))
    return await _generate(request, caller, parsed, generate=True)


async def _generate(
    request: web.Request, caller: Caller, parsed: ParsedChat, *, generate: bool = False
) -> web.StreamResponse:
    model = parsed.request.model

    def encoder() -> ollama_answers.StreamEncoder:
        return ollama_answers.StreamEncoder(model=model, generate=generate)

    if parsed.load_only:
        # Nothing to generate: Ollama loads the model and answers at once; ours stays loaded.
        server_for(request.app[KEY_HASS], caller, model)
        answer = encoder()
        answer.feed(StreamChunk(done=True, finish_reason="load"))
        return web.json_response(answer.answer())
    return await async_answer(
        request, caller, parsed, encoder, wire=OLLAMA_WIRE, ollama_client=True
    )


async def _embed(request: web.Request, caller: Caller) -> web.Response:
    started = time.monotonic()
    parsed = ollama_requests.parse_embed(await read_json(request))
    vectors, usage = await async_embed(request, caller, parsed, ollama_client=True)
    return web.json_response(
        ollama_answers.embed_to_wire(
            vectors,
            usage,
            model=parsed.request.model,
            duration_s=time.monotonic() - started,
        )
    )


_ROUTES: Final[dict[tuple[str, str], Handler]] = {
    ("GET", ""): _root,
    ("GET", "version"): _version,
    ("GET", "tags"): _tags,
    ("GET", "ps"): _ps,
    ("POST", "show"): _show,
    ("POST", "chat"): _chat,
    ("POST", "generate"): _generate_route,
    ("POST", "embed"): _embed,
}
