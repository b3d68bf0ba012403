"""Server kinds as data: every kind has a whole description, and the code reads nothing else.

A sixth kind that exists only here (SGLang, built from vLLM's description) is detected, built and
served against a loopback server of SGLang's shape, with nothing changed outside its description.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
import json
from typing import Any

import aiohttp
import pytest

from custom_components.llm_lanes.core.backends.detect import (
    connect,
    create_backend,
    detect_server,
)
from custom_components.llm_lanes.core.backends.kinds import (
    SERVER_PROFILES,
    ServerKind,
    ServerProfile,
    WireApi,
    server_profile,
)
from custom_components.llm_lanes.core.backends.ollama import OllamaBackend
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.backends.probes import HasKey, Probe
from custom_components.llm_lanes.core.backends.prometheus import first_of
from custom_components.llm_lanes.core.backends.reports import (
    PrometheusMetrics,
    VersionAt,
    max_model_len,
)
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.protocols.openai_requests import chat_body

from .conftest import (
    CHAT,
    FakeServer,
    Handler,
    Serve,
    json_handler,
    lines_handler,
    text_handler,
)

MESSAGES = (ChatMessage(role="user", content="hello"),)


def answer(*texts: str) -> Handler:
    """Stream a chat answer as server-sent events, with usage, then ``[DONE]``."""
    events: list[dict[str, Any] | str] = [
        {"choices": [{"index": 0, "delta": {"content": text}}]} for text in texts
    ]
    events += [
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(texts)}},
        "[DONE]",
    ]
    lines: list[str] = []
    for event in events:
        lines += [f"data: {event if isinstance(event, str) else json.dumps(event)}", ""]
    return lines_handler(lines, "text/event-stream")


# --- every kind -----------------------------------------------------------------------------


def test_every_kind_has_one_description() -> None:
    """Each id of ServerKind is described exactly once, under a name of its own."""
    kinds = [profile.kind for profile in SERVER_PROFILES]
    assert sorted(kinds) == sorted(ServerKind)
    assert len({profile.name for profile in SERVER_PROFILES}) == len(SERVER_PROFILES)
    for kind in ServerKind:
        profile = server_profile(kind)
        assert profile.kind is kind
        assert profile.name
        assert profile.detection
        assert all(evidence for evidence in profile.detection)


def test_a_description_states_every_trait() -> None:
    """No trait has a default: a new description that forgets one does not build."""
    assert [
        field.name
        for field in fields(ServerProfile)
        if field.default is not MISSING or field.default_factory is not MISSING
    ] == []


def test_detection_order() -> None:
    """Ollama is asked first (its own API), the generic OpenAI-compatible server last."""
    assert SERVER_PROFILES[0].api is WireApi.OLLAMA
    assert SERVER_PROFILES[-1].kind is ServerKind.OPENAI_COMPATIBLE
    assert [profile.api for profile in SERVER_PROFILES[1:]] == [WireApi.OPENAI] * (
        len(SERVER_PROFILES) - 1
    )


@pytest.mark.parametrize(
    "profile", SERVER_PROFILES, ids=[profile.kind.value for profile in SERVER_PROFILES]
)
async def test_the_client_follows_the_description(
    session: aiohttp.ClientSession, profile: ServerProfile
) -> None:
    """The API picks the client; the client's slot and prefill abilities are the description's."""
    backend = create_backend(session, "http://h:1", profile.kind)
    assert backend.profile is profile
    assert backend.kind is profile.kind
    assert isinstance(
        backend, OllamaBackend if profile.api is WireApi.OLLAMA else OpenAIBackend
    )
    assert backend.chooses_slots is profile.chooses_slots
    assert backend.prefills_in_steps is profile.prefills_in_steps


async def test_each_client_refuses_the_other_api(
    session: aiohttp.ClientSession,
) -> None:
    """A description of the other API is refused, not half served."""
    with pytest.raises(ValueError, match="OpenAI-compatible API"):
        OpenAIBackend(session, "http://h:1", kind=ServerKind.OLLAMA)
    with pytest.raises(ValueError, match="Ollama's native API"):
        OllamaBackend(session, "http://h:1", kind=ServerKind.VLLM)


OPENAI_PROFILES = [p for p in SERVER_PROFILES if p.api is WireApi.OPENAI]


@pytest.mark.parametrize(
    "profile", OPENAI_PROFILES, ids=[profile.kind.value for profile in OPENAI_PROFILES]
)
async def test_requests_carry_what_the_description_says(
    session: aiohttp.ClientSession, serve: Serve, profile: ServerProfile
) -> None:
    """A resumed answer with a priority and a slot: each kind gets the fields it takes."""
    server = await serve({CHAT: answer(" world")})
    backend = create_backend(session, server.url, profile.kind)
    request = ChatRequest(
        model="m", messages=MESSAGES, assistant_prefix="Hello", priority=2, slot=1
    )
    text = "".join([chunk.text async for chunk in backend.chat(request)])
    assert text == " world"
    (sent,) = server.received["/v1/chat/completions"]
    plain = chat_body(request)
    assert sent["messages"] == plain["messages"]
    expected = dict(profile.resume_fields)
    if profile.takes_priority:
        expected["priority"] = 2
    if profile.chooses_slots:
        expected |= {"id_slot": 1, "cache_prompt": True}
    assert {key: sent[key] for key in sent.keys() - plain.keys()} == expected


# --- a sixth kind, here only ----------------------------------------------------------------


def sglang_metrics(samples: Mapping[str, float]) -> ServerMetrics:
    """Map SGLang's ``sglang:*`` metrics (``--enable-metrics``)."""

    def count(name: str) -> int | None:
        value = first_of(samples, name)
        return None if value is None else round(value)

    return ServerMetrics(
        requests_running=count("sglang:num_running_reqs"),
        requests_waiting=count("sglang:num_queue_reqs"),
        kv_cache_usage=first_of(samples, "sglang:token_usage"),
        prompt_tokens_total=count("sglang:prompt_tokens_total"),
        output_tokens_total=count("sglang:generation_tokens_total"),
    )


SGLANG = replace(
    server_profile(ServerKind.VLLM),
    # A real new kind has its own id in ServerKind; an enum cannot grow in a test, so this one
    # borrows the generic id (what config entries would store). Everything else is its own.
    kind=ServerKind.OPENAI_COMPATIBLE,
    name="SGLang",
    detection=((Probe("/get_model_info", HasKey(("model_path",))),),),
    info_from=(VersionAt("/get_server_info"), max_model_len),
    prometheus=PrometheusMetrics(read=sglang_metrics, optional=False),
)
"""SGLang, as its documentation describes it: ``priority`` (with priority scheduling) and
``continue_final_message`` as vLLM takes them; its own native endpoints and metric names."""

SGLANG_METRICS = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3-8B"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen3-8B"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen3-8B"} 0.25
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="Qwen/Qwen3-8B"} 900.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="Qwen/Qwen3-8B"} 300.0
"""


@pytest.fixture
async def sglang(serve: Serve) -> FakeServer:
    """Start a loopback server of SGLang's shape (the endpoints its description reads)."""
    return await serve(
        {
            "GET /get_model_info": json_handler(
                {
                    "model_path": "Qwen/Qwen3-8B",
                    "tokenizer_path": "Qwen/Qwen3-8B",
                    "is_generation": True,
                }
            ),
            "GET /get_server_info": json_handler(
                {"version": "0.5.3", "context_length": 32768}
            ),
            "GET /v1/models": json_handler(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": "Qwen/Qwen3-8B",
                            "object": "model",
                            "owned_by": "sglang",
                            "max_model_len": 32768,
                        }
                    ],
                }
            ),
            "GET /metrics": text_handler(SGLANG_METRICS),
            CHAT: answer(" world"),
        }
    )


async def test_a_new_kind_is_one_description(
    session: aiohttp.ClientSession, sglang: FakeServer
) -> None:
    """Detected by its probe, described by its sources, served with the fields it takes."""
    assert await detect_server(session, sglang.url) is server_profile(
        ServerKind.OPENAI_COMPATIBLE
    )  # unknown to the shipped table: a generic OpenAI-compatible server
    profiles = (SGLANG, *SERVER_PROFILES)
    assert await detect_server(session, sglang.url, profiles=profiles) is SGLANG

    backend = await connect(session, sglang.url, profiles=profiles)
    assert isinstance(backend, OpenAIBackend)
    assert backend.profile is SGLANG
    info = await backend.server_info()
    assert (info.version, info.context_length, info.metrics_enabled) == (
        "0.5.3",
        32768,
        True,
    )
    assert info.models == info.loaded_models == ("Qwen/Qwen3-8B",)
    metrics = await backend.metrics()
    assert (metrics.requests_running, metrics.requests_waiting) == (3, 1)
    assert metrics.kv_cache_usage == pytest.approx(0.25)
    assert (metrics.prompt_tokens_total, metrics.output_tokens_total) == (900, 300)

    request = ChatRequest(
        model="Qwen/Qwen3-8B", messages=MESSAGES, assistant_prefix="Hello", priority=1
    )
    assert "".join([chunk.text async for chunk in backend.chat(request)]) == " world"
    (sent,) = sglang.received["/v1/chat/completions"]
    assert sent["priority"] == 1
    assert (sent["continue_final_message"], sent["add_generation_prompt"]) == (
        True,
        False,
    )
    assert (backend.chooses_slots, backend.prefills_in_steps) == (False, False)
