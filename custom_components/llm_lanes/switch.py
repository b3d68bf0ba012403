"""Switch of an LLM server: pause the background lane."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from homeassistant.components.switch import SwitchEntity
from homeassistant.const import EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import OPT_BACKGROUND_PAUSED
from .entity import LLMLanesEntity
from .job_entities import job_switches

if TYPE_CHECKING:
    from .models import LLMLanesConfigEntry

PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the background-paused switch."""
    async_add_entities([BackgroundPausedSwitch(entry), *job_switches(entry)])


class BackgroundPausedSwitch(LLMLanesEntity, SwitchEntity):
    """On while no background request is admitted (running ones finish)."""

    _attr_should_poll = False
    _attr_translation_key = OPT_BACKGROUND_PAUSED
    _attr_entity_category = EntityCategory.CONFIG

    def __init__(self, entry: LLMLanesConfigEntry) -> None:
        """Show the entry's background-paused setting."""
        super().__init__(entry, OPT_BACKGROUND_PAUSED)

    async def async_added_to_hass(self) -> None:
        """Follow option changes (this entity's and the options flow's)."""
        await super().async_added_to_hass()
        self.async_on_remove(self.entry.add_update_listener(self._async_entry_updated))

    async def _async_entry_updated(
        self, hass: HomeAssistant, entry: LLMLanesConfigEntry
    ) -> None:
        self.async_write_ha_state()

    @property
    def is_on(self) -> bool:
        """Whether the scheduler holds background requests back."""
        return self.entry.runtime_data.scheduler.settings.background_paused

    async def async_turn_on(self, **kwargs: Any) -> None:
        """Pause the background lane."""
        self._set_paused(True)

    async def async_turn_off(self, **kwargs: Any) -> None:
        """Resume the background lane."""
        self._set_paused(False)

    def _set_paused(self, paused: bool) -> None:
        self.hass.config_entries.async_update_entry(
            self.entry, options={**self.entry.options, OPT_BACKGROUND_PAUSED: paused}
        )
