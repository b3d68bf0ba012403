"""Keeping the configured model warm, against the simulated server in both of its modes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
import logging

from aiohttp import web
from freezegun.api import FrozenDateTimeFactory
from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import CONF_MODEL, DOMAIN, SUBENTRY_CONVERSATION
from custom_components.llm_lanes.coordinator import (
    WARM_UP_RETRY_INTERVAL,
    PollCoordinator,
)
from tools.simulator.server import SimConfig, SimulatedServer

from .support.entries import MODEL, async_set_up, server_entry

LOADED_LOG = f"Loaded model {MODEL}"
FAILED_LOG = f"Could not load model {MODEL}"


class UnloadingOllama(SimulatedServer):
    """The Ollama simulator, with a model that is resident only after a load request.

    The plain simulator always lists its model in ``/api/ps``; a real Ollama lists it only once a
    request loaded it, and drops it after ``keep_alive`` or a restart (``unload``).
    """

    def __init__(self, *, loads: bool = True) -> None:
        """Start with the model not loaded; ``loads=False``: load requests never load it."""
        super().__init__(SimConfig(kind="ollama", speed=50.0))
        self.resident = False
        self.loads = loads
        self.load_requests = 0
        self.hold_loads: asyncio.Event | None = None
        """When set to an event, load requests wait for it (a model that takes long to load)."""

    def unload(self) -> None:
        """Drop the model from memory, as Ollama does when its keep_alive runs out."""
        self.resident = False

    async def _ollama_ps(self, request: web.Request) -> web.Response:
        if self.resident:
            return await super()._ollama_ps(request)
        return web.json_response({"models": []})

    async def _ollama_chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("messages"):
            self.load_requests += 1
            if self.hold_loads is not None:
                await self.hold_loads.wait()
            if self.loads:
                self.resident = True
        return await super()._ollama_chat(request)


def _entry(url: str, kind: str) -> MockConfigEntry:
    return server_entry(url, kind)


async def _set_up(hass: HomeAssistant, url: str, kind: str) -> MockConfigEntry:
    return await async_set_up(hass, _entry(url, kind))


def _loaded_model_sensor(hass: HomeAssistant, entry: MockConfigEntry) -> str:
    entity_id = er.async_get(hass).async_get_entity_id(
        "sensor", DOMAIN, f"{entry.entry_id}_loaded_model"
    )
    assert entity_id is not None
    state = hass.states.get(entity_id)
    assert state is not None
    return state.state


async def _poll(hass: HomeAssistant, server: PollCoordinator) -> None:
    await server.async_refresh()
    await hass.async_block_till_done(wait_background_tasks=True)


class _Records(logging.Handler):
    """Collects the integration's log messages (the suite may run without pytest's logging)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def count(self, start: str) -> int:
        """How many messages begin with ``start``."""
        return sum(message.startswith(start) for message in self.messages)


@pytest.fixture
def log() -> Iterator[_Records]:
    """Record what the integration logs at INFO and above."""
    logger = logging.getLogger("custom_components.llm_lanes")
    records = _Records()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(records)
    yield records
    logger.removeHandler(records)
    logger.setLevel(level)


@pytest.fixture
async def unloading_ollama(socket_enabled: None) -> AsyncIterator[UnloadingOllama]:
    """Run an Ollama whose model is not loaded until something asks for it."""
    async with UnloadingOllama() as server:
        yield server


async def test_llama_cpp_is_never_warmed_up(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """llama.cpp always has its one model loaded: no warm-up at set-up or at any poll."""
    server = init_integration.runtime_data.server
    for _ in range(3):
        await _poll(hass, server)
    assert server.data.model_loaded
    assert server.warm_ups == 0
    assert sim.requests_seen == []


async def test_ollama_model_is_pinned_at_setup(
    ha_core: HomeAssistant, socket_enabled: None, log: _Records
) -> None:
    """Ollama: one load request at set-up keeps the model resident (keep_alive), once."""
    hass = ha_core
    async with SimulatedServer(SimConfig(kind="ollama", speed=50.0)) as sim:
        entry = await _set_up(hass, sim.url, "ollama")
        server = entry.runtime_data.server
        for _ in range(3):
            await _poll(hass, server)
        assert server.warm_ups == 1
        assert [body["keep_alive"] for body in sim.requests_seen] == [-1]
        assert sim.requests_seen[0]["messages"] == []
        assert server.data.model_loaded
        # It was loaded already: nothing to announce.
        assert log.count(LOADED_LOG) == 0
        assert await hass.config_entries.async_unload(entry.entry_id)


async def test_warm_up_at_setup_and_after_unload(
    ha_core: HomeAssistant,
    unloading_ollama: UnloadingOllama,
    log: _Records,
) -> None:
    """Set-up loads a cold model; a poll that finds it unloaded loads it again."""
    hass = ha_core
    entry = await _set_up(hass, unloading_ollama.url, "ollama")
    server = entry.runtime_data.server
    assert unloading_ollama.load_requests == 1
    assert server.data.model_loaded
    assert _loaded_model_sensor(hass, entry) == MODEL
    assert log.count(LOADED_LOG) == 1

    unloading_ollama.unload()
    await _poll(hass, server)
    assert unloading_ollama.load_requests == 2
    assert server.warm_ups == 2
    assert server.data.model_loaded
    assert _loaded_model_sensor(hass, entry) == MODEL
    assert log.count(LOADED_LOG) == 2

    # Loaded: the next polls leave it alone.
    await _poll(hass, server)
    assert unloading_ollama.load_requests == 2


async def test_one_warm_up_at_a_time(
    ha_core: HomeAssistant, unloading_ollama: UnloadingOllama
) -> None:
    """Set-up does not wait for a slow load, and polls meanwhile start no second one."""
    hass = ha_core
    unloading_ollama.hold_loads = asyncio.Event()
    entry = _entry(unloading_ollama.url, "ollama")
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    assert entry.state is ConfigEntryState.LOADED
    server = entry.runtime_data.server
    while unloading_ollama.load_requests == 0:
        await asyncio.sleep(0.01)
    assert server.warming_up
    assert not server.data.model_loaded

    for _ in range(3):
        await server.async_refresh()
    assert server.warm_ups == 1
    assert unloading_ollama.load_requests == 1

    unloading_ollama.hold_loads.set()
    await hass.async_block_till_done(wait_background_tasks=True)
    assert not server.warming_up
    assert server.data.model_loaded
    assert unloading_ollama.load_requests == 1


async def test_server_that_never_loads_is_not_asked_at_every_poll(
    ha_core: HomeAssistant,
    socket_enabled: None,
    freezer: FrozenDateTimeFactory,
    log: _Records,
) -> None:
    """A load that does not load waits WARM_UP_RETRY_INTERVAL before the next; one warning."""
    hass = ha_core
    async with UnloadingOllama(loads=False) as ollama:
        entry = await _set_up(hass, ollama.url, "ollama")
        try:
            await _check_retries(hass, entry, ollama, freezer, log)
        finally:
            assert await hass.config_entries.async_unload(entry.entry_id)


async def _check_retries(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    ollama: UnloadingOllama,
    freezer: FrozenDateTimeFactory,
    log: _Records,
) -> None:
    server = entry.runtime_data.server
    assert ollama.load_requests == 1
    assert not server.data.model_loaded
    assert log.count(FAILED_LOG) == 1

    for _ in range(3):
        await _poll(hass, server)
    assert ollama.load_requests == 1

    freezer.tick(WARM_UP_RETRY_INTERVAL + timedelta(seconds=1))
    await _poll(hass, server)
    assert ollama.load_requests == 2
    assert log.count(FAILED_LOG) == 1  # warned once, not at each try

    # The model finally loads (memory was freed): the next try succeeds.
    ollama.loads = True
    freezer.tick(WARM_UP_RETRY_INTERVAL + timedelta(seconds=1))
    await _poll(hass, server)
    assert ollama.load_requests == 3
    assert server.data.model_loaded
    assert log.count(LOADED_LOG) == 1


async def test_model_the_server_does_not_have_is_not_warmed_up(
    ha_core: HomeAssistant, unloading_ollama: UnloadingOllama
) -> None:
    """A model that is not installed is a repair issue; loading it would only fail."""
    hass = ha_core
    entry = await async_set_up(
        hass, server_entry(unloading_ollama.url, "ollama", model="gone")
    )
    server = entry.runtime_data.server
    await _poll(hass, server)
    assert not server.data.model_loaded
    assert server.warm_ups == 0
    assert unloading_ollama.load_requests == 0


async def test_prepare_reloads_an_unloaded_model_at_once(
    ha_core: HomeAssistant, unloading_ollama: UnloadingOllama
) -> None:
    """The Assist pipeline's prepare finds the model unloaded and loads it before the command."""
    hass = ha_core
    assert await async_setup_component(hass, "conversation", {})
    entry = await async_set_up(
        hass,
        server_entry(
            unloading_ollama.url,
            "ollama",
            subentries_data=[
                {
                    "subentry_type": SUBENTRY_CONVERSATION,
                    "data": {CONF_MODEL: MODEL},
                    "subentry_id": "conversation_1",
                    "title": "Agent",
                    "unique_id": None,
                }
            ],
        ),
    )
    server = entry.runtime_data.server
    scheduler = entry.runtime_data.scheduler
    assert unloading_ollama.load_requests == 1
    unloading_ollama.unload()  # between two polls: the coordinator still thinks it is loaded
    assert server.data.model_loaded
    agent_id = er.async_get(hass).async_get_entity_id(
        "conversation", DOMAIN, f"{entry.entry_id}_conversation_1"
    )
    assert agent_id is not None
    await conversation.async_prepare_agent(hass, agent_id, "en")
    await hass.async_block_till_done(wait_background_tasks=True)
    assert unloading_ollama.load_requests == 2
    assert server.data.model_loaded
    # The scheduler makes room for voice for a while.
    assert scheduler.snapshot().taken_at < scheduler._foreground.announced_until
    # Loaded: a second prepare asks nothing of the server.
    await conversation.async_prepare_agent(hass, agent_id, "en")
    await hass.async_block_till_done(wait_background_tasks=True)
    assert unloading_ollama.load_requests == 2
