"""A client that goes away is cancelled at the server: mid-stream, and while still queued.

Run with and without the HTTP server cancelling handlers itself (Home Assistant's does).
"""

from __future__ import annotations

import asyncio
import contextlib

from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_MAX_SEQUENCES
from tests.support.entities import async_set_options
from tests.support.entries import MODEL, REAL_SPEED_SIM
from tests.support.requests import async_wait_for, finished_requests
from tools.simulator.server import SimulatedServer

from .conftest import Gateway
from .samples import HELLO, long_stream

pytestmark = [
    pytest.mark.parametrize("handler_cancellation", [False, True]),
    pytest.mark.parametrize("sim_config", [REAL_SPEED_SIM], ids=["real_speed"]),
]


async def test_disconnect_mid_stream_frees_the_slot(
    gateway: Gateway, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """Closing a stream after its first tokens cancels it at the server and frees its slot."""
    client = await gateway.add_client(init_integration)
    finished = finished_requests(init_integration)
    stream = await long_stream(gateway.openai(client.api_key))
    events = aiter(stream)
    await anext(events)
    await anext(events)
    assert len(sim.engine.running) == 1
    await stream.close()

    await async_wait_for(lambda: not sim.engine.running and finished != [])
    assert sim.engine.stats.cancelled_total == 1
    assert [f.outcome for f in finished] == ["cancelled"]
    assert 0 < finished[0].output_tokens < 2000
    assert init_integration.runtime_data.scheduler.snapshot().in_flight == 0


async def test_disconnect_while_queued_frees_the_place(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
    sim: SimulatedServer,
) -> None:
    """A client that gives up while queued leaves the queue at once; nothing reaches the server."""
    await async_set_options(hass, init_integration, **{OPT_MAX_SEQUENCES: 1})
    holder = await gateway.add_client(init_integration, name="Holder")
    client = await gateway.add_client(init_integration, name="Impatient")
    scheduler = init_integration.runtime_data.scheduler
    stream = await long_stream(gateway.openai(holder.api_key))
    await anext(aiter(stream))
    seen = len(sim.requests_seen)

    impatient = gateway.ollama(client.api_key)
    waiting = asyncio.create_task(impatient.chat(model=MODEL, messages=HELLO))
    await async_wait_for(lambda: scheduler.snapshot().queue_depth == 1)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    await impatient.close()  # the app quits: its connection closes

    await async_wait_for(lambda: scheduler.snapshot().queue_depth == 0)
    assert scheduler.snapshot().in_flight == 1  # the holder still streams
    assert len(sim.requests_seen) == seen
    await stream.close()
