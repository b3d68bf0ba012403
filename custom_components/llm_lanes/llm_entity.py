"""Base of the entities built from subentries (conversation agents, AI Task entities)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.helpers.device_registry import DeviceEntryType, DeviceInfo

from .chat import async_run_chat_log
from .const import CONF_MODEL, DOMAIN
from .core.lanes import Lane
from .entity import LLMLanesEntity, server_device_info

if TYPE_CHECKING:
    from .models import LLMLanesConfigEntry


class LLMLanesSubentryEntity(LLMLanesEntity):
    """An entity of one subentry (its own device, via the server's), sending through its scheduler."""

    _attr_name = None

    def __init__(self, entry: LLMLanesConfigEntry, subentry: ConfigSubentry) -> None:
        """Name the entity after its subentry."""
        super().__init__(entry, subentry.subentry_id)
        self.subentry = subentry
        # A device belongs to one subentry, so each agent gets its own device, linked to the
        # server's device (``via_device_id``).
        server = server_device_info(entry)
        self._attr_device_info = DeviceInfo(
            identifiers={(DOMAIN, subentry.subentry_id)},
            name=subentry.title,
            manufacturer=server.get("manufacturer"),
            model=subentry.data.get(CONF_MODEL, entry.data[CONF_MODEL]),
            entry_type=DeviceEntryType.SERVICE,
            via_device_id=entry.runtime_data.device_id,
        )

    @property
    def settings(self) -> dict[str, Any]:
        """The subentry's settings, over the entry's (model)."""
        return {**self.entry.data, **self.subentry.data}

    async def _async_answer(
        self,
        chat_log: conversation.ChatLog,
        *,
        lane: Lane,
        requester: str,
        json_schema: dict[str, Any] | None = None,
    ) -> None:
        """Answer the chat log through the server's scheduler."""
        await async_run_chat_log(
            self.entry.runtime_data.scheduler,
            chat_log,
            agent_id=self.entity_id,
            settings=self.settings,
            lane=lane,
            requester=requester,
            json_schema=json_schema,
        )
