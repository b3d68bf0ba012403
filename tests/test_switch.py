"""Switch: background paused holds background requests back, live."""

from __future__ import annotations

import asyncio

from homeassistant.components.switch import DOMAIN as SWITCH_DOMAIN
from homeassistant.const import (
    ATTR_ENTITY_ID,
    SERVICE_TURN_OFF,
    SERVICE_TURN_ON,
    STATE_OFF,
    STATE_ON,
)
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_BACKGROUND_PAUSED
from custom_components.llm_lanes.core.bench.simulator import SimConfig
from custom_components.llm_lanes.core.lanes import Lane

from .support.entities import async_flush_snapshots, entity_id_for, state_of
from .support.requests import async_generate, async_wait_for


@pytest.fixture
def sim_config() -> SimConfig:
    """Run a fast simulated server with four slots."""
    return SimConfig(slots=4, speed=50)


async def _switch(hass: HomeAssistant, entity_id: str, service: str) -> None:
    await hass.services.async_call(
        SWITCH_DOMAIN, service, {ATTR_ENTITY_ID: entity_id}, blocking=True
    )
    await hass.async_block_till_done()


@pytest.mark.usefixtures("entity_registry_enabled_by_default")
async def test_background_paused(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Paused: a background request waits (its lane's queue shows it); resumed: it runs."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    switch = entity_id_for(hass, entry, "switch", OPT_BACKGROUND_PAUSED)
    assert state_of(hass, entry, "switch", OPT_BACKGROUND_PAUSED) == STATE_OFF

    await _switch(hass, switch, SERVICE_TURN_ON)
    assert entry.options[OPT_BACKGROUND_PAUSED] is True
    assert scheduler.settings.background_paused is True
    assert state_of(hass, entry, "switch", OPT_BACKGROUND_PAUSED) == STATE_ON

    job = asyncio.create_task(
        async_generate(entry, lane=Lane.BACKGROUND, requester="job:nightly")
    )
    await async_wait_for(lambda: scheduler.snapshot().queue_depth == 1)
    await async_flush_snapshots(hass, seconds=11)
    assert state_of(hass, entry, "sensor", "background_queue_depth") == "1"
    assert not job.done()

    await _switch(hass, switch, SERVICE_TURN_OFF)
    assert entry.options[OPT_BACKGROUND_PAUSED] is False
    assert state_of(hass, entry, "switch", OPT_BACKGROUND_PAUSED) == STATE_OFF
    result = await job
    assert result.finished.outcome == "ok"
    await async_flush_snapshots(hass)
    assert state_of(hass, entry, "sensor", "background_queue_depth") == "0"
