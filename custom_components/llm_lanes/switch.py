"""Switch of an LLM server: pause the background lane."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from homeassistant.components.switch import SwitchEntity
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import OPT_BACKGROUND_PAUSED
from .entity import SchedulerSettingEntity
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


class BackgroundPausedSwitch(SchedulerSettingEntity, SwitchEntity):
    """On while no background request is admitted (running ones finish)."""

    _attr_translation_key = OPT_BACKGROUND_PAUSED

    def __init__(self, entry: LLMLanesConfigEntry) -> None:
        """Show the entry's background-paused setting."""
        super().__init__(entry, OPT_BACKGROUND_PAUSED)

    @property
    def is_on(self) -> bool:
        """Whether the scheduler holds background requests back."""
        return self.settings.background_paused

    async def async_turn_on(self, **kwargs: Any) -> None:
        """Pause the background lane."""
        self._store_option(OPT_BACKGROUND_PAUSED, True)

    async def async_turn_off(self, **kwargs: Any) -> None:
        """Resume the background lane."""
        self._store_option(OPT_BACKGROUND_PAUSED, False)
