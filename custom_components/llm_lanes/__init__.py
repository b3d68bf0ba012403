"""LLM Lanes: a priority scheduler in front of a household's local LLM server."""

from __future__ import annotations

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant

PLATFORMS: list[Platform] = []

type LLMLanesConfigEntry = ConfigEntry[None]


async def async_setup_entry(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> bool:
    """Set up one LLM server from a config entry."""
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    return True


async def async_unload_entry(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> bool:
    """Unload a config entry."""
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
