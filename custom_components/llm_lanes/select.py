"""Select of an LLM server: the scheduling policy (lanes, or first-come-first-served)."""

from __future__ import annotations

from homeassistant.components.select import SelectEntity, SelectEntityDescription
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from custom_components.llm_lanes.const import OPT_POLICY
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.settings import Policy
from custom_components.llm_lanes.entity import SchedulerSettingEntity

PARALLEL_UPDATES = 0

POLICY = SelectEntityDescription(
    key=OPT_POLICY,
    translation_key=OPT_POLICY,
    options=[policy.value for policy in Policy],
)


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the policy select."""
    async_add_entities([PolicySelect(entry, POLICY)])


class PolicySelect(SchedulerSettingEntity, SelectEntity):
    """Lane scheduling, or arrival order under the same limits (to compare the two)."""

    @property
    def current_option(self) -> str:
        """The policy the scheduler runs with."""
        return self.settings.policy.value

    async def async_select_option(self, option: str) -> None:
        """Store the new policy in the options; the options listener applies it."""
        await self._async_store_option(Policy(option).value)
