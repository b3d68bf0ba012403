"""Switches of an LLM server: pause the background lane, pause the nightly jobs."""

from __future__ import annotations

from typing import Any

from homeassistant.components.switch import SwitchEntity, SwitchEntityDescription
from homeassistant.components.switch.const import SwitchDeviceClass
from homeassistant.const import EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from custom_components.llm_lanes.authorization import async_require_admin
from custom_components.llm_lanes.const import OPT_BACKGROUND_PAUSED
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.entity import JobEntity, SchedulerSettingEntity

PARALLEL_UPDATES = 0

BACKGROUND_PAUSED = SwitchEntityDescription(
    key=OPT_BACKGROUND_PAUSED,
    translation_key=OPT_BACKGROUND_PAUSED,
    # The one switch of a server with a device class: a blueprint's entity selector can offer it
    # alone (its filter knows integration, domain and device class, not which switch it is).
    device_class=SwitchDeviceClass.SWITCH,
)
JOBS_PAUSED = SwitchEntityDescription(
    key="jobs_paused",
    translation_key="jobs_paused",
    entity_category=EntityCategory.CONFIG,
)


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the background-paused and jobs-paused switches."""
    async_add_entities(
        [
            BackgroundPausedSwitch(entry, BACKGROUND_PAUSED),
            JobsPausedSwitch(entry, JOBS_PAUSED),
        ]
    )


class BackgroundPausedSwitch(SchedulerSettingEntity, SwitchEntity):
    """On while no background request is admitted (running ones finish)."""

    @property
    def is_on(self) -> bool:
        """Whether the scheduler holds background requests back."""
        return self.settings.background_paused

    async def async_turn_on(self, **kwargs: Any) -> None:
        """Pause the background lane."""
        await self._async_store_option(True)

    async def async_turn_off(self, **kwargs: Any) -> None:
        """Resume the background lane."""
        await self._async_store_option(False)


class JobsPausedSwitch(JobEntity, SwitchEntity):
    """When on, no job starts (running ones finish); kept across restarts."""

    @property
    def is_on(self) -> bool:
        """Whether jobs are paused."""
        return self.manager.paused

    async def async_turn_on(self, **kwargs: Any) -> None:
        """Pause the jobs (an admin's or an automation's change, as the options)."""
        await async_require_admin(self.hass, self._context, entity_id=self.entity_id)
        self.manager.set_paused(True)

    async def async_turn_off(self, **kwargs: Any) -> None:
        """Let the jobs run again (an admin's or an automation's change, as the options)."""
        await async_require_admin(self.hass, self._context, entity_id=self.entity_id)
        self.manager.set_paused(False)
