"""The OpenAI-compatible endpoint: ``/api/llm_lanes/v1`` with ``Authorization: Bearer <key>``.

``GET /models`` (and ``/models/<id>``), ``POST /chat/completions``, ``POST /completions`` and
``POST /embeddings``, whatever the server behind (requests and streams are translated by
``core.protocols``). The key is a client key, or a Home Assistant access token (its user is the
requester, in the interactive lane).
"""

from __future__ import annotations

import secrets
import time
from typing import Final

from aiohttp import web
from homeassistant.helpers.http import KEY_HASS, HomeAssistantView

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.protocols import openai_answers, openai_requests
from custom_components.llm_lanes.core.protocols.common import ParsedChat
from custom_components.llm_lanes.gateway.auth import (
    Caller,
    async_authenticate,
    bearer_key,
)
from custom_components.llm_lanes.gateway.clients import OPENAI_PATH
from custom_components.llm_lanes.gateway.http_errors import OPENAI_WIRE, model_not_found
from custom_components.llm_lanes.gateway.relay import Handler, read_json, serve
from custom_components.llm_lanes.gateway.serving import (
    async_answer,
    async_embed,
    servers_for,
)

MODEL_PREFIX: Final = "models/"


class OpenAIView(HomeAssistantView):
    """Every path under the OpenAI-compatible base URL."""

    url = f"{OPENAI_PATH}/{{endpoint:.+}}"
    name = "api:llm_lanes:openai"
    requires_auth = False
    """Client keys are checked here; Home Assistant's own auth has checked its tokens."""

    async def get(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        """Answer ``GET /v1/<endpoint>``."""
        return await _async_serve(request, "GET", endpoint)

    async def post(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        """Answer ``POST /v1/<endpoint>``."""
        return await _async_serve(request, "POST", endpoint)


async def _async_serve(
    request: web.Request, method: str, endpoint: str
) -> web.StreamResponse:
    path = endpoint.strip("/")
    handler = _ROUTES.get((method, path))
    if method == "GET" and path.startswith(MODEL_PREFIX):
        handler = _model
    return await serve(
        request,
        OPENAI_WIRE,
        lambda: async_authenticate(request, bearer_key(request), users=True),
        handler,
        f"{OPENAI_PATH}/{path}",
    )


async def _models(request: web.Request, caller: Caller) -> web.Response:
    servers = servers_for(request.app[KEY_HASS], caller)
    names = dict.fromkeys(model for server in servers for model in server.models)
    return web.json_response(openai_answers.models_to_wire(names, owner=DOMAIN))


async def _model(request: web.Request, caller: Caller) -> web.Response:
    model = request.match_info["endpoint"].strip("/").removeprefix(MODEL_PREFIX)
    for server in servers_for(request.app[KEY_HASS], caller):
        if (name := server.served_model(model)) is not None:
            return web.json_response(openai_answers.model_to_wire(name, owner=DOMAIN))
    raise model_not_found(model)


async def _chat(request: web.Request, caller: Caller) -> web.StreamResponse:
    parsed = openai_requests.parse_chat(await read_json(request))
    return await _answer(
        request, caller, parsed, openai_answers.StreamEncoder, "chatcmpl"
    )


async def _completion(request: web.Request, caller: Caller) -> web.StreamResponse:
    parsed = openai_requests.parse_completion(await read_json(request))
    return await _answer(
        request, caller, parsed, openai_answers.CompletionEncoder, "cmpl"
    )


async def _answer(
    request: web.Request,
    caller: Caller,
    parsed: ParsedChat,
    encoder_type: type[openai_answers.StreamEncoder | openai_answers.CompletionEncoder],
    id_prefix: str,
) -> web.StreamResponse:
    def encoder() -> openai_answers.StreamEncoder | openai_answers.CompletionEncoder:
        return encoder_type(
            model=parsed.request.model,
            completion_id=f"{id_prefix}-{secrets.token_hex(12)}",
            created=int(time.time()),
            include_usage=parsed.include_usage,
        )

    return await async_answer(
        request, caller, parsed, encoder, wire=OPENAI_WIRE, ollama_client=False
    )


async def _embeddings(request: web.Request, caller: Caller) -> web.Response:
    parsed = openai_requests.parse_embeddings(await read_json(request))
    vectors, usage = await async_embed(request, caller, parsed, ollama_client=False)
    return web.json_response(
        openai_answers.embeddings_to_wire(
            vectors, usage, model=parsed.request.model, base64_vectors=parsed.base64
        )
    )


_ROUTES: Final[dict[tuple[str, str], Handler]] = {
    ("GET", "models"): _models,
    ("POST", "chat/completions"): _chat,
    ("POST", "completions"): _completion,
    ("POST", "embeddings"): _embeddings,
}
