"""Home Assistant stops, or the server's entry unloads, while the gateway answers: nobody is left cut.

Every stream in flight ends at once with an error its client reads as one (the ``openai``
client raises ``APIError`` on the error event, the ``ollama`` client ``ResponseError`` on the
error line); a request still waiting is answered 503 with ``Retry-After``, and so is one that
comes once Home Assistant is stopping. "At once" is shown by what ends them, not by a clock: the
slow simulated server would stream its answers for minutes, and each ends with the stop's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from homeassistant.core import HassJob, HomeAssistant
import ollama
import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.gateway.http_errors import UNAVAILABLE_RETRY_AFTER_S
from custom_components.llm_lanes.gateway.in_flight import IN_FLIGHT
from tests.support.entries import MODEL
from tests.support.requests import async_wait_for
from tools.simulator.server import SimConfig, SimulatedServer

from .conftest import Gateway
from .samples import HELLO, long_stream

HANG_GUARD_S = 60.0
"""Only against a hang: the answers would stream for minutes if the stop did not end them."""


@pytest.fixture
def sim_config() -> SimConfig:
    """One slow simulated llama.cpp: even a short answer streams for seconds."""
    return SimConfig(slots=2, speed=0.05)


async def openai_error(stream: AsyncIterator[Any]) -> str:
    """Read a stream to its end; return the message of the error that ends it."""
    with pytest.raises(openai.APIError) as ended:
        async for _ in stream:
            pass
    return ended.value.message


async def ollama_error(stream: AsyncIterator[Any]) -> str:
    """Read an Ollama stream to its end; return the error that ends it."""
    with pytest.raises(ollama.ResponseError) as ended:
        async for _ in stream:
            pass
    return ended.value.error


async def streams_and_a_waiting_request(
    gateway: Gateway, entry: MockConfigEntry
) -> tuple[list[asyncio.Task[str]], asyncio.Task[Any]]:
    """Start an OpenAI and an Ollama stream (both slots busy) and a third chat that waits.

    Return the tasks that read each stream to its error, and the waiting chat's.
    """
    client, api = await gateway.add_openai_client(entry)
    scheduler: Scheduler = entry.runtime_data.scheduler
    openai_stream = aiter(await long_stream(api))
    await anext(openai_stream)
    ollama_stream = aiter(
        await gateway.ollama(client.api_key).chat(
            model=MODEL, messages=HELLO, stream=True
        )
    )
    await anext(ollama_stream)
    assert scheduler.snapshot().in_flight == 2
    waiting = asyncio.create_task(
        api.chat.completions.create(model=MODEL, messages=HELLO)
    )
    await async_wait_for(lambda: scheduler.snapshot().queue_depth == 1)
    readers = [
        asyncio.create_task(openai_error(openai_stream)),
        asyncio.create_task(ollama_error(ollama_stream)),
    ]
    return readers, waiting


async def ended_within(
    end: Callable[[], Awaitable[Any]],
    readers: list[asyncio.Task[str]],
    waiting: asyncio.Task[Any],
) -> tuple[list[str], openai.APIStatusError]:
    """End the requests with ``end``; check that every client had its error.

    Return the streams' errors and the waiting request's refusal.
    """
    ending = asyncio.create_task(end())
    async with asyncio.timeout(HANG_GUARD_S):
        errors = await asyncio.gather(*readers)
        with pytest.raises(openai.APIStatusError) as refused:
            await waiting
    await ending
    return errors, refused.value


@pytest.mark.parametrize("how", ["stop", "unload"])
async def test_stop_or_unload_ends_every_request_with_an_error(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
    sim: SimulatedServer,
    how: str,
) -> None:
    """Home Assistant stops, or the server's entry unloads: every request ends with an error.

    An error event, an error line, a 503 + Retry-After; the server is freed (an unload is a
    reload or a removal).
    """
    readers, waiting = await streams_and_a_waiting_request(gateway, init_integration)

    async def unload() -> None:
        assert await hass.config_entries.async_unload(init_integration.entry_id)

    errors, refused = await ended_within(
        hass.async_stop if how == "stop" else unload, readers, waiting
    )

    said = {"stop": "Home Assistant is stopping", "unload": "shutting down"}[how]
    assert all(said in error for error in errors)
    assert refused.status_code == 503
    if how == "stop":
        assert refused.code == "shutting_down"
    assert refused.response.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_S)
    await async_wait_for(lambda: not sim.engine.running)
    if how == "stop":
        assert sim.engine.stats.cancelled_total == 2


async def test_a_request_during_the_stop_is_refused(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
    sim: SimulatedServer,
) -> None:
    """Once Home Assistant is stopping, a request is answered 503 + Retry-After at once."""
    _, api = await gateway.add_openai_client(init_integration)
    release = asyncio.Event()

    async def shutdown_automation() -> None:
        # A shutdown job still running: the HTTP server still takes requests meanwhile.
        await release.wait()

    hass.async_add_shutdown_job(HassJob(shutdown_automation))
    stopping = asyncio.create_task(hass.async_stop())
    await async_wait_for(lambda: hass.data[IN_FLIGHT].stopping)
    with pytest.raises(openai.APIStatusError) as refused:
        await api.chat.completions.create(model=MODEL, messages=HELLO)
    assert refused.value.status_code == 503
    assert refused.value.response.headers["Retry-After"] == str(
        UNAVAILABLE_RETRY_AFTER_S
    )
    assert sim.requests_seen == []
    release.set()
    await stopping
