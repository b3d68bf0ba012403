"""Set-up and unload of a config entry."""

from __future__ import annotations

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import DOMAIN


@pytest.mark.usefixtures("ha_core")
async def test_setup_and_unload(hass: HomeAssistant) -> None:
    """A config entry loads, then unloads cleanly."""
    entry = MockConfigEntry(domain=DOMAIN, data={CONF_URL: "http://127.0.0.1:11434"})
    entry.add_to_hass(hass)

    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED

    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.NOT_LOADED
