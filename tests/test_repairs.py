"""Repair issues: server unreachable for minutes, configured model missing (with a fix flow)."""

from __future__ import annotations

from datetime import timedelta

from homeassistant.components.repairs import DOMAIN as REPAIRS_DOMAIN
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import issue_registry as ir
from homeassistant.setup import async_setup_component
from homeassistant.util import dt as dt_util
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
)

from custom_components.llm_lanes.const import CONF_MODEL, DOMAIN
from custom_components.llm_lanes.repairs import (
    model_missing_issue_id,
    unreachable_issue_id,
)
from tools.simulator.server import SimConfig, SimulatedServer

from .support.llamacpp import free_port


@pytest.fixture
def sim_config(socket_enabled: None) -> SimConfig:
    """Put the simulated server on a fixed port, so it can be stopped and started again."""
    return SimConfig(slots=2, speed=50.0, port=free_port())


async def test_unreachable_issue_raised_and_cleared(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """A short outage raises nothing; one of several minutes does; recovery clears it."""
    entry = init_integration
    issues = ir.async_get(hass)
    issue_id = unreachable_issue_id(entry.entry_id)
    server = entry.runtime_data.server

    await sim.stop()
    await server.async_refresh()
    assert not server.last_update_success
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(minutes=2))
    await hass.async_block_till_done()
    assert issues.async_get_issue(DOMAIN, issue_id) is None

    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(minutes=6))
    await hass.async_block_till_done()
    issue = issues.async_get_issue(DOMAIN, issue_id)
    assert issue is not None
    assert issue.translation_key == "server_unreachable"

    await sim.start()
    await server.async_refresh()
    await hass.async_block_till_done()
    assert server.last_update_success
    assert issues.async_get_issue(DOMAIN, issue_id) is None


@pytest.mark.usefixtures("ha_core")
async def test_model_missing_issue_and_fix(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, sim_config: SimConfig
) -> None:
    """A configured model the server lost raises a fixable issue; the fix picks another one."""
    entry = mock_config_entry
    entry.add_to_hass(hass)
    hass.config_entries.async_update_entry(
        entry, data={**entry.data, CONF_MODEL: "gone"}
    )
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    issue_id = model_missing_issue_id(entry.entry_id)
    issue = ir.async_get(hass).async_get_issue(DOMAIN, issue_id)
    assert issue is not None and issue.is_fixable

    assert await async_setup_component(hass, REPAIRS_DOMAIN, {})
    manager = hass.data[REPAIRS_DOMAIN]["flow_manager"]
    result = await manager.async_init(DOMAIN, data={"issue_id": issue_id})
    assert result["type"] is FlowResultType.FORM
    result = await manager.async_configure(
        result["flow_id"], {CONF_MODEL: sim_config.model}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert entry.data[CONF_MODEL] == sim_config.model
    assert entry.state is ConfigEntryState.LOADED
    assert ir.async_get(hass).async_get_issue(DOMAIN, issue_id) is None
