"""Binary sensor of an LLM server: whether it answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeassistant.components.binary_sensor import BinarySensorEntity
from homeassistant.components.binary_sensor.const import BinarySensorDeviceClass
from homeassistant.const import EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .entity import LLMLanesEntity

if TYPE_CHECKING:
    from .models import LLMLanesConfigEntry

PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the server-reachable sensor."""
    async_add_entities([ServerReachableSensor(entry)])


class ServerReachableSensor(LLMLanesEntity, BinarySensorEntity):
    """On while the server answered its last poll; itself always available."""

    _attr_should_poll = False
    _attr_translation_key = "server_reachable"
    _attr_device_class = BinarySensorDeviceClass.CONNECTIVITY
    _attr_entity_category = EntityCategory.DIAGNOSTIC

    def __init__(self, entry: LLMLanesConfigEntry) -> None:
        """Follow the entry's server coordinator."""
        super().__init__(entry, "server_reachable")

    @property
    def available(self) -> bool:
        """Always available: being off is how it says the server is down."""
        return True

    @property
    def is_on(self) -> bool:
        """Whether the last poll of the server succeeded."""
        return self.entry.runtime_data.server.last_update_success
