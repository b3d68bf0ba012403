"""Detection from a base URL: each kind of server told apart by what only it answers."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from custom_components.llm_lanes.core.backends.detect import (
    connect,
    create_backend,
    detect_server_kind,
)
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.ollama import OllamaBackend
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.errors import AuthError, BackendConnectionError
from tools.simulator.server import SimConfig, SimulatedServer

from .conftest import Serve, json_handler, text_handler

VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "Qwen/Qwen3-8B",
            "object": "model",
            "owned_by": "vllm",
            "max_model_len": 32768,
        }
    ],
}
LM_STUDIO_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "qwen3-8b",
            "object": "model",
            "type": "llm",
            "state": "loaded",
            "max_context_length": 32768,
            "loaded_context_length": 8192,
        },
        {"id": "gemma-3", "object": "model", "type": "llm", "state": "not-loaded"},
    ],
}
PLAIN_MODELS = {"object": "list", "data": [{"id": "model-a", "object": "model"}]}


async def test_llama_cpp(session: aiohttp.ClientSession) -> None:
    """The simulator in llama.cpp mode answers /props with total_slots."""
    async with SimulatedServer(SimConfig(slots=3)) as sim:
        assert await detect_server_kind(session, sim.url) is ServerKind.LLAMA_CPP
        backend = await connect(session, sim.url)
        assert isinstance(backend, OpenAIBackend)
        assert (await backend.server_info()).slots == 3


async def test_vllm_by_owner(session: aiohttp.ClientSession, serve: Serve) -> None:
    """VLLM lists its models as owned by "vllm"; info reads /version and max_model_len."""
    server = await serve(
        {
            "GET /v1/models": json_handler(VLLM_MODELS),
            "GET /version": json_handler({"version": "0.11.0"}),
            "GET /metrics": text_handler("vllm:num_requests_running 0\n"),
        }
    )
    backend = await connect(session, server.url)
    assert backend.kind is ServerKind.VLLM
    info = await backend.server_info()
    assert (info.version, info.context_length, info.metrics_enabled) == (
        "0.11.0",
        32768,
        True,
    )
    assert info.models == ("Qwen/Qwen3-8B",)


async def test_vllm_by_metrics(session: aiohttp.ClientSession, serve: Serve) -> None:
    """A vLLM that does not say it owns its models is known by its metric names."""
    server = await serve(
        {
            "GET /v1/models": json_handler(PLAIN_MODELS),
            "GET /metrics": text_handler("vllm:num_requests_running 0\n"),
        }
    )
    assert await detect_server_kind(session, server.url) is ServerKind.VLLM


async def test_lm_studio(session: aiohttp.ClientSession, serve: Serve) -> None:
    """LM Studio's /api/v0/models says which model is loaded and with what context."""
    server = await serve(
        {
            "GET /v1/models": json_handler(PLAIN_MODELS),
            "GET /api/v0/models": json_handler(LM_STUDIO_MODELS),
        }
    )
    backend = await connect(session, server.url)
    assert backend.kind is ServerKind.LM_STUDIO
    info = await backend.server_info()
    assert info.loaded_models == ("qwen3-8b",)
    assert info.context_length == 8192
    assert (await backend.metrics()).loaded_models == ("qwen3-8b",)


async def test_localai(session: aiohttp.ClientSession, serve: Serve) -> None:
    """LocalAI lists its backends at /system."""
    server = await serve(
        {
            "GET /v1/models": json_handler(PLAIN_MODELS),
            "GET /system": json_handler(
                {"backends": ["llama-cpp"], "loaded_models": []}
            ),
            "GET /version": json_handler({"version": "v3.6.0"}),
        }
    )
    backend = await connect(session, server.url)
    assert backend.kind is ServerKind.LOCALAI
    assert (await backend.server_info()).version == "v3.6.0"


async def test_generic_openai(session: aiohttp.ClientSession, serve: Serve) -> None:
    """Anything else with /v1/models is a generic OpenAI-compatible server."""
    server = await serve({"GET /v1/models": json_handler(PLAIN_MODELS)})
    backend = await connect(session, server.url + "/v1")
    assert backend.kind is ServerKind.OPENAI_COMPATIBLE
    info = await backend.server_info()
    assert info.models == ("model-a",)
    assert info.slots is None


async def test_not_an_llm_server(session: aiohttp.ClientSession, serve: Serve) -> None:
    """A web server that answers 404 everywhere is not mistaken for anything."""
    server = await serve({"GET /": text_handler("hello")})
    with pytest.raises(
        BackendConnectionError, match="no Ollama or OpenAI-compatible LLM server"
    ):
        await detect_server_kind(session, server.url)


async def test_nothing_listening(session: aiohttp.ClientSession) -> None:
    """A refused connection is reported as such, not as "unknown server"."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(BackendConnectionError, match="cannot connect"):
        await detect_server_kind(session, f"http://127.0.0.1:{port}")


async def test_api_key_refused(session: aiohttp.ClientSession, serve: Serve) -> None:
    """A server that wants a key it did not get: AuthError, not "unknown server"."""
    refused = json_handler({"error": "Unauthorized"}, 401)
    server = await serve(
        {"GET /api/version": refused, "GET /props": refused, "GET /v1/models": refused}
    )
    with pytest.raises(AuthError, match="HTTP 401"):
        await detect_server_kind(session, server.url, api_key="wrong")


async def test_create_backend(session: aiohttp.ClientSession) -> None:
    """The factory picks the client class by kind."""
    assert isinstance(
        create_backend(session, "http://h:11434", ServerKind.OLLAMA), OllamaBackend
    )
    backend = create_backend(session, "http://h:8000/v1/", ServerKind.VLLM)
    assert isinstance(backend, OpenAIBackend)
    assert backend.kind is ServerKind.VLLM
    assert backend.base_url == "http://h:8000"
