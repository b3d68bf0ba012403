"""The OpenAI-compatible endpoint: ``/api/llm_lanes/v1`` with ``Authorization: Bearer <key>``.

``GET /models`` (and ``/models/<id>``), ``POST /chat/completions``, ``POST /completions`` and
``POST /embeddings``, whatever the server behind (requests and streams are translated by
``core.protocols``). The key is a client key, or a Home Assistant access token (its user is the
requester, in the interactive lane).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
import secrets
import time
from typing import Final

from aiohttp import web
from homeassistant.helpers.http import KEY_HASS, HomeAssistantView

from ..const import DOMAIN  # noqa: TID252
from ..core.protocols import openai  # noqa: TID252
from .auth import Caller, async_authenticate, bearer_key
from .clients import OPENAI_PATH
from .errors import NOT_FOUND, OPENAI_WIRE, GatewayError, model_not_found
from .relay import read_json, serve
from .serving import async_answer, async_embed, servers_for

type Handler = Callable[[web.Request, Caller], Awaitable[web.StreamResponse]]

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
    async def handle() -> web.StreamResponse:
        caller = await async_authenticate(request, bearer_key(request), users=True)
        path = endpoint.strip("/")
        if method == "GET" and path.startswith(MODEL_PREFIX):
            return _model(request, caller, path.removeprefix(MODEL_PREFIX))
        handler = _ROUTES.get((method, path))
        if handler is None:
            raise GatewayError(
                HTTPStatus.NOT_FOUND,
                f"no such endpoint: {method} {OPENAI_PATH}/{path}",
                kind=NOT_FOUND,
                code="unknown_endpoint",
            )
        return await handler(request, caller)

    return await serve(request, OPENAI_WIRE, handle)


async def _models(request: web.Request, caller: Caller) -> web.Response:
    servers = servers_for(request.app[KEY_HASS], caller)
    names = dict.fromkeys(model for server in servers for model in server.models)
    return web.json_response(openai.models_to_wire(names, owner=DOMAIN))


def _model(request: web.Request, caller: Caller, model: str) -> web.Response:
    for server in servers_for(request.app[KEY_HASS], caller):
        if (name := server.served_model(model)) is not None:
            return web.json_response(openai.model_to_wire(name, owner=DOMAIN))
    raise model_not_found(model)


def _answer_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


async def _chat(request: web.Request, caller: Caller) -> web.StreamResponse:
    parsed = openai.parse_chat(await read_json(request))

    def encoder() -> openai.StreamEncoder:
        return openai.StreamEncoder(
            model=parsed.request.model,
            completion_id=_answer_id("chatcmpl"),
            created=int(time.time()),
            include_usage=parsed.include_usage,
        )

    return await async_answer(
        request, caller, parsed, encoder, wire=OPENAI_WIRE, ollama_client=False
    )


async def _completion(request: web.Request, caller: Caller) -> web.StreamResponse:
    parsed = openai.parse_completion(await read_json(request))

    def encoder() -> openai.CompletionEncoder:
        return openai.CompletionEncoder(
            model=parsed.request.model,
            completion_id=_answer_id("cmpl"),
            created=int(time.time()),
            include_usage=parsed.include_usage,
        )

    return await async_answer(
        request, caller, parsed, encoder, wire=OPENAI_WIRE, ollama_client=False
    )


async def _embeddings(request: web.Request, caller: Caller) -> web.Response:
    parsed = openai.parse_embeddings(await read_json(request))
    vectors, usage = await async_embed(request, caller, parsed, ollama_client=False)
    return web.json_response(
        openai.embeddings_to_wire(
            vectors, usage, model=parsed.request.model, base64_vectors=parsed.base64
        )
    )


_ROUTES: Final[dict[tuple[str, str], Handler]] = {
    ("GET", "models"): _models,
    ("POST", "chat/completions"): _chat,
    ("POST", "completions"): _completion,
    ("POST", "embeddings"): _embeddings,
}
