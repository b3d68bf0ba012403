"""Set-up, live option changes, reload and unload of a server entry."""

from __future__ import annotations

import asyncio
from typing import Any

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    CONF_MODEL,
    DOMAIN,
    OPT_BACKGROUND_PAUSED,
    OPT_MAX_SEQUENCES,
    OPT_POLICY,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.core.errors import SchedulerClosedError
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.settings import Policy
from custom_components.llm_lanes.jobs.store import storage_key
from tools.simulator.server import SimConfig, SimulatedServer

from .support.entities import async_set_options
from .support.entries import async_set_up, server_entry
from .support.requests import async_call_action


def _request(model: str) -> ChatRequest:
    return ChatRequest(
        model=model,
        messages=(ChatMessage(role="user", content="hello"),),
        max_tokens=2000,
        options={"ignore_eos": True},
    )


async def test_setup_builds_device_and_scheduler(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim_config: SimConfig
) -> None:
    """The entry loads; the device describes the server; slots come from the server."""
    entry = init_integration
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.scheduler.settings.max_sequences == sim_config.slots
    device = dr.async_get(hass).async_get_device_by_identifier(
        (DOMAIN, entry.entry_id), entry.entry_id
    )
    assert device is not None
    assert device.manufacturer == "llama.cpp"
    assert device.model == sim_config.model
    assert device.sw_version
    assert device.configuration_url == entry.data[CONF_URL]
    agents = dr.async_entries_for_config_entry(dr.async_get(hass), entry.entry_id)
    assert {d.via_device_id for d in agents if d.id != device.id} == {device.id}


async def test_options_apply_live(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Options written by the control entities change the scheduler without a reload."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    await async_set_options(
        hass,
        entry,
        **{OPT_MAX_SEQUENCES: 1, OPT_POLICY: "fifo", OPT_BACKGROUND_PAUSED: True},
    )
    assert entry.runtime_data.scheduler is scheduler
    assert scheduler.settings.max_sequences == 1
    assert scheduler.settings.policy is Policy.FIFO
    assert scheduler.settings.background_paused is True


@pytest.mark.usefixtures("ha_core")
async def test_server_down_at_start_retries(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, sim: SimulatedServer
) -> None:
    """Set-up is retried (ConfigEntryNotReady) while the server does not answer."""
    await sim.stop()
    mock_config_entry.add_to_hass(hass)
    await hass.config_entries.async_setup(mock_config_entry.entry_id)
    await hass.async_block_till_done()
    assert mock_config_entry.state is ConfigEntryState.SETUP_RETRY


async def test_unload_cancels_running_requests(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim_config: SimConfig
) -> None:
    """Unloading closes the scheduler: running and queued callers get SchedulerClosedError."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    tasks = [
        asyncio.create_task(
            scheduler.generate(
                _request(sim_config.model), lane=Lane.BACKGROUND, requester="job:test"
            )
        )
        for _ in range(sim_config.slots + 2)
    ]
    # Background may not take the headroom slot: some run, the others wait.
    while (snapshot := scheduler.snapshot()).in_flight < 1 or snapshot.queue_depth < 1:
        await asyncio.sleep(0.01)
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.NOT_LOADED
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(result, SchedulerClosedError) for result in results), results


async def test_reload(hass: HomeAssistant, init_integration: MockConfigEntry) -> None:
    """A reload builds a new scheduler and closes the old one."""
    entry = init_integration
    old = entry.runtime_data.scheduler
    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.scheduler is not old


async def test_remove_entry_forgets_its_jobs(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_storage: dict[str, Any],
) -> None:
    """Deleting the server removes its stored jobs; a queued job was stored before."""
    entry = init_integration
    await async_call_action(
        hass, "summarize", name="digest", text="The door opened twice."
    )
    await hass.async_block_till_done()
    assert storage_key(entry.entry_id) in hass_storage

    assert await hass.config_entries.async_remove(entry.entry_id)
    await hass.async_block_till_done()
    assert storage_key(entry.entry_id) not in hass_storage


async def test_entries_before_1_2_get_agents_named_after_their_server(
    hass: HomeAssistant,
    ha_core: HomeAssistant,
    sim: SimulatedServer,
    sim_config: SimConfig,
) -> None:
    """Default titles of 1.1 ("… conversation", "… AI Task") lose their suffix; others stay."""
    kind = sim_config.kind
    subentries: list[dict[str, Any]] = [
        {
            "subentry_type": subentry_type,
            "data": {CONF_MODEL: sim_config.model},
            "title": title,
            "unique_id": None,
        }
        for subentry_type, title in (
            (SUBENTRY_CONVERSATION, "llama.cpp on 127.0.0.1 conversation"),
            (SUBENTRY_AI_TASK, f"llama.cpp on 127.0.0.1:{sim.port} AI Task"),
            (SUBENTRY_CONVERSATION, "Kitchen helper"),
        )
    ]
    entry = server_entry(
        sim.url,
        kind,
        model=sim_config.model,
        minor_version=1,
        subentries_data=subentries,
    )
    await async_set_up(hass, entry)
    assert entry.minor_version == 2
    assert sorted(s.title for s in entry.subentries.values()) == [
        "Kitchen helper",
        "llama.cpp on 127.0.0.1",
        f"llama.cpp on 127.0.0.1:{sim.port}",
    ]
    names = {
        state.name
        for state in hass.states.async_all(["conversation", "ai_task"])
        if state.entity_id != "conversation.home_assistant"
    }
    assert names == {
        "Kitchen helper",
        "llama.cpp on 127.0.0.1 Conversation",
        f"llama.cpp on 127.0.0.1:{sim.port} AI Task",
    }


async def test_a_newer_entry_is_not_set_up(
    hass: HomeAssistant,
    ha_core: HomeAssistant,
    sim: SimulatedServer,
    sim_config: SimConfig,
) -> None:
    """An entry of a later major version (a downgrade) is left alone."""
    entry = server_entry(sim.url, sim_config.kind, model=sim_config.model, version=2)
    await async_set_up(hass, entry, loaded=False)
    assert entry.state is ConfigEntryState.MIGRATION_ERROR
