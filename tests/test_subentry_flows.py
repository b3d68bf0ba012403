"""The subentry flows of agents and AI Task entities (the gateway clients' are in tests/gateway)."""

from __future__ import annotations

from homeassistant import config_entries
from homeassistant.const import CONF_NAME
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    CONF_LLM_HASS_API,
    CONF_MODEL,
    CONF_PROMPT,
    CONF_TEMPERATURE,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)

from .support.entries import async_start_subentry_flow


async def test_subentry_flows(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Agents and AI Task entities are added and reconfigured; the entry reloads for them."""
    entry = init_integration
    result = await async_start_subentry_flow(hass, entry, SUBENTRY_CONVERSATION)
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "Second agent",
            CONF_MODEL: entry.data[CONF_MODEL],
            CONF_PROMPT: "Be brief.",
            CONF_LLM_HASS_API: ["assist"],
            CONF_TEMPERATURE: 0.2,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    titles = {s.title for s in entry.subentries.values()}
    assert "Second agent" in titles
    names = {state.name for state in hass.states.async_all("conversation")}
    assert names == {"Home Assistant", "Sim agent", "Second agent"}, names

    subentry = next(
        s for s in entry.subentries.values() if s.subentry_type == SUBENTRY_AI_TASK
    )
    result = await entry.start_subentry_reconfigure_flow(hass, subentry.subentry_id)
    assert result["step_id"] == "reconfigure"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_MODEL: entry.data[CONF_MODEL], CONF_TEMPERATURE: 0.1}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert entry.subentries[subentry.subentry_id].data[CONF_TEMPERATURE] == 0.1


@pytest.mark.usefixtures("ha_core")
async def test_subentry_flow_needs_loaded_entry(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry
) -> None:
    """Adding an agent to a server that is not loaded aborts."""
    mock_config_entry.add_to_hass(hass)
    result = await hass.config_entries.subentries.async_init(
        (mock_config_entry.entry_id, SUBENTRY_AI_TASK),
        context={"source": config_entries.SOURCE_USER},
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "entry_not_loaded"
