"""Every error status of the gateway, in each API's shape, and nothing queued on 401/400/413.

The simulated llama.cpp runs at its real speed here, so a long answer holds its slot while a
test fills the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import contextlib
import logging
from unittest.mock import patch

from homeassistant.const import CONF_API_KEY
from homeassistant.core import HomeAssistant
import ollama
import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    CONF_LANE,
    OPT_MAX_SEQUENCES,
    OPT_QUOTA_ACTION,
    SUBENTRY_CLIENT,
)
from custom_components.llm_lanes.core.errors import LimitExceededError
from custom_components.llm_lanes.gateway.http_errors import (
    UNAVAILABLE_RETRY_AFTER_S,
    http_error_of,
)
from custom_components.llm_lanes.gateway.relay import MAX_BODY_BYTES
from tests.support.entities import async_set_options
from tests.support.entries import MODEL, REAL_SPEED_SIM, async_set_up, server_entry
from tests.support.llamacpp import free_port
from tests.support.requests import async_wait_for, finished_requests
from tools.simulator.server import SimConfig, SimulatedServer

from .conftest import LOGIN_THRESHOLD, Gateway
from .samples import HELLO, long_stream


@pytest.fixture
def sim_config() -> SimConfig:
    """One simulated llama.cpp at real speed (a fixture: not every test here runs a server)."""
    return REAL_SPEED_SIM


@contextlib.asynccontextmanager
async def holding_the_slot(api: openai.AsyncOpenAI) -> AsyncIterator[None]:
    """Keep a long answer streaming (its first token came: it holds its slot) during the block."""
    stream = await long_stream(api)
    await anext(aiter(stream))
    try:
        yield
    finally:
        await stream.close()


async def test_bad_requests_queue_nothing(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """401, 400 naming the field, 413, 404 in OpenAI's shape; none reaches the scheduler."""
    client = await gateway.add_client(init_integration)
    finished = finished_requests(init_integration)
    seen = len(sim.requests_seen)
    api = gateway.openai(client.api_key)

    with pytest.raises(openai.AuthenticationError) as unauthorized:
        await gateway.openai("wrong").chat.completions.create(
            model=MODEL, messages=HELLO
        )
    assert unauthorized.value.status_code == 401
    assert unauthorized.value.type == "authentication_error"
    assert unauthorized.value.code == "invalid_api_key"

    with pytest.raises(openai.BadRequestError) as bad_role:
        await api.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "user", "content": "Hi"},
                {"role": "robot", "content": "?"},
            ],  # type: ignore[list-item]
        )
    assert bad_role.value.param == "messages[1].role"
    assert bad_role.value.code == "invalid_value"

    with pytest.raises(openai.BadRequestError) as no_messages:
        await api.chat.completions.create(model=MODEL, messages=[])
    assert no_messages.value.param == "messages"

    with pytest.raises(openai.APIStatusError) as too_large:
        await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x" * (MAX_BODY_BYTES + 1)}],
        )
    assert too_large.value.status_code == 413
    assert too_large.value.code == "request_too_large"

    with pytest.raises(openai.NotFoundError) as unknown:
        await api.chat.completions.create(model="gpt-17", messages=HELLO)
    assert unknown.value.code == "model_not_found"
    assert unknown.value.param == "model"

    assert finished == []
    assert len(sim.requests_seen) == seen


async def test_ollama_shape(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """The same errors in Ollama's shape (``{"error": "..."}``), nothing queued."""
    _, api = await gateway.add_ollama_client(init_integration)
    finished = finished_requests(init_integration)

    with pytest.raises(ollama.ResponseError) as unauthorized:
        await gateway.ollama("wrong").chat(model=MODEL, messages=HELLO)
    assert unauthorized.value.status_code == 401
    assert "invalid or missing API key" in unauthorized.value.error
    # The key of the Ollama endpoint is in its host URL; its access tokens are the other's.
    assert "host URL" in unauthorized.value.error
    assert "OpenAI" not in unauthorized.value.error
    assert "access token" not in unauthorized.value.error

    with pytest.raises(ollama.ResponseError) as bad_role:
        await api.chat(model=MODEL, messages=[{"role": "robot", "content": "?"}])
    assert bad_role.value.status_code == 400
    assert bad_role.value.error.startswith("messages[0].role: ")

    with pytest.raises(ollama.ResponseError) as unknown:
        await api.chat(model="llama9", messages=HELLO)
    assert unknown.value.status_code == 404

    with pytest.raises(ollama.ResponseError) as too_large:
        await api.generate(model=MODEL, prompt="x" * (MAX_BODY_BYTES + 1))
    assert too_large.value.status_code == 413
    assert finished == []


async def test_failed_logins_are_banned_and_keys_not_logged(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Wrong keys count as wrong passwords: the address is banned; the URL logged hides the key."""
    client = await gateway.add_client(init_integration)
    wrong = "0123456789wrongkey"
    caplog.set_level(logging.DEBUG)
    with patch("homeassistant.components.http.ban.IpBanManager._add_ban"):
        for _ in range(LOGIN_THRESHOLD):
            with pytest.raises(ollama.ResponseError) as refused:
                await gateway.ollama(wrong).list()
            assert refused.value.status_code == 401
        # Banned: even the right key is refused now.
        with pytest.raises(ollama.ResponseError) as banned:
            await gateway.ollama(client.api_key).list()
    assert banned.value.status_code == 403
    # Home Assistant's debug log and aiohttp's access log show request paths; above them the
    # key is hidden, and LLM Lanes itself never logs it.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    ours = [
        r.getMessage() for r in caplog.records if r.name.startswith("custom_components")
    ]
    assert "/api/llm_lanes/ollama/**REDACTED**/api/tags" in "\n".join(warnings)
    for key in (wrong, client.api_key):
        assert not [message for message in warnings + ours if key in message]


async def test_full_queue_and_spent_quota_are_429(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
) -> None:
    """A full lane queue and a spent quota answer 429 with Retry-After."""
    await async_set_options(
        hass,
        init_integration,
        **{
            OPT_MAX_SEQUENCES: 1,
            OPT_QUOTA_ACTION: "reject",
            "interactive": {"max_queued": 1},
        },
    )
    holder = await gateway.add_client(init_integration, name="Holder")
    _, api = await gateway.add_openai_client(init_integration, name="Chat")
    scheduler = init_integration.runtime_data.scheduler

    async with holding_the_slot(gateway.openai(holder.api_key)):
        waiting = asyncio.create_task(
            api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        )
        await async_wait_for(lambda: scheduler.snapshot().queue_depth == 1)
        with pytest.raises(openai.RateLimitError) as full:
            await api.chat.completions.create(model=MODEL, messages=HELLO)
        assert full.value.code == "queue_full"
        assert full.value.response.headers["Retry-After"] == "2"
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting

    stingy = await gateway.add_client(
        init_integration, name="Stingy", quota_tokens_per_day=1
    )
    assert scheduler.settings.requester_quotas[stingy.requester] == 1
    api = gateway.openai(stingy.api_key)
    await api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as spent:
        await api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert spent.value.code == "quota_exceeded"
    assert spent.value.response.headers["Retry-After"] == "300"


@pytest.mark.parametrize(
    "seen_down",
    [True, False],
    ids=["polled down: does not answer", "gone since the poll: cannot connect"],
)
async def test_server_down_is_503(
    gateway: Gateway,
    init_integration: MockConfigEntry,
    sim: SimulatedServer,
    seen_down: bool,
) -> None:
    """A server that stopped answering is a 503 that says why, in both shapes, to retry later.

    Seen down by a poll it "does not answer"; gone since the last poll, the request "cannot
    connect".
    """
    client = await gateway.add_client(init_integration)
    await sim.stop()
    if seen_down:
        await init_integration.runtime_data.server.async_refresh()

    with pytest.raises(openai.APIStatusError) as down:
        await gateway.openai(client.api_key).chat.completions.create(
            model=MODEL, messages=HELLO
        )
    assert down.value.status_code == 503
    assert ("does not answer" if seen_down else "cannot connect") in down.value.message
    assert down.value.response.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_S)
    if seen_down:
        with pytest.raises(ollama.ResponseError) as ollama_down:
            await gateway.ollama(client.api_key).chat(model=MODEL, messages=HELLO)
        assert ollama_down.value.status_code == 503


async def test_error_after_the_first_token_ends_the_stream(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """A server that fails mid-stream: the stream ends with an error event, not a 500."""
    client = await gateway.add_client(init_integration)
    stream = await long_stream(gateway.openai(client.api_key))
    events = aiter(stream)
    await anext(events)
    # The server dies: its open connections drop.
    assert sim._runner is not None and sim._runner.server is not None
    for connection in sim._runner.server.connections:
        assert connection.transport is not None
        connection.transport.abort()
    with pytest.raises(openai.APIError) as failed:
        async for _ in events:
            pass
    assert "closed" in failed.value.message


async def test_client_of_a_server_not_set_up_is_503(
    hass: HomeAssistant, gateway: Gateway
) -> None:
    """A valid key of a server that failed to set up is "unavailable", not "unauthorized"."""
    entry = server_entry(
        f"http://127.0.0.1:{free_port()}",
        "llama_cpp",
        subentries_data=[
            {
                "subentry_type": SUBENTRY_CLIENT,
                "data": {
                    CONF_LANE: "voice",
                    CONF_API_KEY: "a-key-of-a-server-that-is-down",
                },
                "title": "Phone",
                "unique_id": None,
            }
        ],
    )
    await async_set_up(hass, entry, loaded=False)
    with pytest.raises(openai.APIStatusError) as down:
        await gateway.openai("a-key-of-a-server-that-is-down").models.list()
    assert down.value.status_code == 503
    assert "not available" in down.value.message
    assert down.value.response.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_S)


def test_a_lane_limit_names_the_field_the_client_set() -> None:
    """An output limit broken through the OpenAI API names ``max_tokens``, the client's field.

    (The gateway caps a client's output at its lane's limit, so only a limit that changes under
    a request breaks it; the wording is checked here.)
    """
    error = http_error_of(
        LimitExceededError(
            lane="voice", limit="max_output_tokens", value=5000, maximum=1024
        )
    )
    assert error.param == "max_tokens"
    assert error.message.startswith("max_tokens of 5000")
    prompt = http_error_of(
        LimitExceededError(
            lane="voice", limit="max_prompt_tokens", value=9000, maximum=4096
        )
    )
    assert prompt.param == "messages"
