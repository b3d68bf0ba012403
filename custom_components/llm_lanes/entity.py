"""Base class of every LLM Lanes entity: one device per LLM server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from homeassistant.const import CONF_URL, EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers.device_registry import DeviceInfo
from homeassistant.helpers.entity import Entity

from .const import CONF_KIND, CONF_MODEL, DOMAIN
from .core.backends.base import ServerKind

if TYPE_CHECKING:
    from .core.settings import SchedulerSettings
    from .models import LLMLanesConfigEntry

SERVER_KIND_NAMES: dict[ServerKind, str] = {
    ServerKind.OLLAMA: "Ollama",
    ServerKind.LLAMA_CPP: "llama.cpp",
    ServerKind.VLLM: "vLLM",
    ServerKind.LM_STUDIO: "LM Studio",
    ServerKind.LOCALAI: "LocalAI",
    ServerKind.OPENAI_COMPATIBLE: "OpenAI-compatible server",
}


def server_device_info(entry: LLMLanesConfigEntry) -> DeviceInfo:
    """Describe the device that stands for the entry's LLM server."""
    server = entry.runtime_data.server
    kind = ServerKind(entry.data[CONF_KIND])
    version = server.data.info.version if server.data is not None else None
    return DeviceInfo(
        identifiers={(DOMAIN, entry.entry_id)},
        name=entry.title,
        manufacturer=SERVER_KIND_NAMES[kind],
        model=entry.data[CONF_MODEL],
        sw_version=version,
        configuration_url=entry.data[CONF_URL],
    )


class LLMLanesEntity(Entity):
    """An entity of one LLM server's device.

    It is unavailable while the server coordinator's last poll failed, and it writes its state
    when that changes. Subclasses that also derive from ``CoordinatorEntity`` should list
    ``LLMLanesEntity`` first so that both availability conditions apply.
    """

    _attr_has_entity_name = True

    def __init__(self, entry: LLMLanesConfigEntry, key: str) -> None:
        """Attach the entity to the server's device; ``key`` makes its unique id."""
        self.entry = entry
        self._attr_unique_id = f"{entry.entry_id}_{key}"
        self._attr_device_info = server_device_info(entry)

    @property
    def available(self) -> bool:
        """Whether the server answered its last poll (and any other condition holds)."""
        return super().available and self.entry.runtime_data.server.last_update_success

    async def async_added_to_hass(self) -> None:
        """Follow the server coordinator so availability changes are written."""
        await super().async_added_to_hass()
        self.async_on_remove(
            self.entry.runtime_data.server.async_add_listener(self.async_write_ha_state)
        )


class SchedulerSettingEntity(LLMLanesEntity):
    """A control that shows one scheduler setting and stores changes in the entry options.

    The options update listener applies stored options to the scheduler live; this entity writes
    its state on every options change, its own and the options flow's.
    """

    _attr_should_poll = False
    _attr_entity_category = EntityCategory.CONFIG

    @property
    def settings(self) -> SchedulerSettings:
        """The settings the scheduler runs with now."""
        return self.entry.runtime_data.scheduler.settings

    async def async_added_to_hass(self) -> None:
        """Follow option changes."""
        await super().async_added_to_hass()
        self.async_on_remove(self.entry.add_update_listener(self._async_entry_updated))

    async def _async_entry_updated(
        self, hass: HomeAssistant, entry: LLMLanesConfigEntry
    ) -> None:
        self.async_write_ha_state()

    def _store_option(self, option: str, value: Any) -> None:
        """Store one option; the options listener applies it to the scheduler."""
        self.hass.config_entries.async_update_entry(
            self.entry, options={**self.entry.options, option: value}
        )
