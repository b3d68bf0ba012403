"""Switch: background paused holds background requests back, live."""

from __future__ import annotations

import asyncio

from homeassistant.const import SERVICE_TURN_OFF, SERVICE_TURN_ON, STATE_OFF, STATE_ON
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_BACKGROUND_PAUSED
from custom_components.llm_lanes.core.lanes import Lane

from .support.entities import async_call_entity_action, async_flush_snapshots, state_of
from .support.requests import async_generate, async_wait_for


@pytest.mark.usefixtures("entity_registry_enabled_by_default")
async def test_background_paused(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Paused: a background request waits (its lane's queue shows it); resumed: it runs."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    assert state_of(hass, entry, "switch", OPT_BACKGROUND_PAUSED) == STATE_OFF

    await async_call_entity_action(
        hass, entry, "switch", OPT_BACKGROUND_PAUSED, SERVICE_TURN_ON
    )
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

    await async_call_entity_action(
        hass, entry, "switch", OPT_BACKGROUND_PAUSED, SERVICE_TURN_OFF
    )
    assert entry.options[OPT_BACKGROUND_PAUSED] is False
    assert state_of(hass, entry, "switch", OPT_BACKGROUND_PAUSED) == STATE_OFF
    result = await job
    assert result.finished.outcome == "ok"
    await async_flush_snapshots(hass)
    assert state_of(hass, entry, "sensor", "background_queue_depth") == "0"
