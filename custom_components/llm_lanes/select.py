"""Select of an LLM server: the scheduling policy (lanes, or first-come-first-served)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeassistant.components.select import SelectEntity
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import OPT_POLICY
from .core.settings import Policy
from .entity import SchedulerSettingEntity

if TYPE_CHECKING:
    from .models import LLMLanesConfigEntry

PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the policy select."""
    async_add_entities([PolicySelect(entry)])


class PolicySelect(SchedulerSettingEntity, SelectEntity):
    """Lane scheduling, or arrival order under the same limits (to compare the two)."""

    _attr_translation_key = OPT_POLICY
    _attr_options = [policy.value for policy in Policy]

    def __init__(self, entry: LLMLanesConfigEntry) -> None:
        """Show the entry's scheduling policy."""
        super().__init__(entry, OPT_POLICY)

    @property
    def current_option(self) -> str:
        """The policy the scheduler runs with."""
        return self.settings.policy.value

    async def async_select_option(self, option: str) -> None:
        """Store the new policy in the options; the options listener applies it."""
        self._store_option(OPT_POLICY, Policy(option).value)
