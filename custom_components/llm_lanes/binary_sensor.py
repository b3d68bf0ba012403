"""Binary sensor of an LLM server: whether it answers."""

from __future__ import annotations

from homeassistant.components.binary_sensor import (
    BinarySensorEntity,
    BinarySensorEntityDescription,
)
from homeassistant.components.binary_sensor.const import BinarySensorDeviceClass
from homeassistant.const import EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.entity import ServerEntity

PARALLEL_UPDATES = 0

SERVER_REACHABLE = BinarySensorEntityDescription(
    key="server_reachable",
    translation_key="server_reachable",
    device_class=BinarySensorDeviceClass.CONNECTIVITY,
    entity_category=EntityCategory.DIAGNOSTIC,
)


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the server-reachable sensor."""
    async_add_entities([ServerReachableSensor(entry, SERVER_REACHABLE)])


class ServerReachableSensor(ServerEntity, BinarySensorEntity):
    """On while the server answered its last poll; itself always available."""

    @property
    def available(self) -> bool:
        """Always available: being off is how it says the server is down."""
        return True

    @property
    def is_on(self) -> bool:
        """Whether the last poll of the server succeeded."""
        return self.coordinator.last_update_success
