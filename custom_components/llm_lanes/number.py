"""Numbers of an LLM server: max sequences and background share, written to the entry options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from homeassistant.components.number import (
    NumberEntity,
    NumberEntityDescription,
    NumberMode,
)
from homeassistant.const import PERCENTAGE
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from custom_components.llm_lanes.const import OPT_BACKGROUND_SHARE, OPT_MAX_SEQUENCES
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.entity import SchedulerSettingEntity
from custom_components.llm_lanes.settings_options import (
    fraction_of_percent,
    percent_of_fraction,
)

PARALLEL_UPDATES = 0


@dataclass(frozen=True, kw_only=True)
class SettingNumberDescription(NumberEntityDescription):
    """A scheduler setting shown as a number and stored under the option named by its key."""

    value_fn: Callable[[SchedulerSettings], float]
    """The setting as the entity shows it."""
    to_option: Callable[[float], Any]
    """The entity's value as the option stores it."""


NUMBERS: tuple[SettingNumberDescription, ...] = (
    SettingNumberDescription(
        key=OPT_MAX_SEQUENCES,
        translation_key=OPT_MAX_SEQUENCES,
        mode=NumberMode.BOX,
        native_min_value=1,
        native_max_value=64,
        native_step=1,
        value_fn=lambda settings: settings.max_sequences,
        to_option=int,
    ),
    SettingNumberDescription(
        key=OPT_BACKGROUND_SHARE,
        translation_key=OPT_BACKGROUND_SHARE,
        mode=NumberMode.SLIDER,
        native_min_value=0,
        native_max_value=100,
        native_step=1,
        native_unit_of_measurement=PERCENTAGE,
        # Shown in percent, stored (like the scheduler setting) as a fraction.
        value_fn=lambda settings: percent_of_fraction(settings.background_share),
        to_option=fraction_of_percent,
    ),
)


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the scheduler setting numbers."""
    async_add_entities(SettingNumber(entry, description) for description in NUMBERS)


class SettingNumber(SchedulerSettingEntity, NumberEntity):
    """A scheduler setting; changing it updates the entry options, applied live."""

    entity_description: SettingNumberDescription

    @property
    def native_value(self) -> float:
        """The setting the scheduler runs with."""
        return self.entity_description.value_fn(self.settings)

    async def async_set_native_value(self, value: float) -> None:
        """Store the new value in the options; the options listener applies it."""
        await self._async_store_option(self.entity_description.to_option(value))
