"""Entity bases of LLM Lanes: one device per LLM server, availability from its coordinator.

Every entity is a ``CoordinatorEntity`` of one of the entry's two coordinators: the poll
coordinator (what the server reports, and whether it answers) or the activity coordinator (the
scheduler's snapshots). Whichever it reads, an entity is unavailable while the server's last poll
failed. Controls show the scheduler's settings (written again once the entry's options are
applied), job entities follow the entry's job manager, and the entities of subentries (agents,
AI Task) get a device of their own, linked to the server's.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import CONF_URL, EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers import translation
from homeassistant.helpers.device_registry import DeviceEntryType, DeviceInfo
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.helpers.entity import Entity, EntityDescription
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.helpers.update_coordinator import (
    CoordinatorEntity,
    DataUpdateCoordinator,
)
from yarl import URL

from custom_components.llm_lanes.authorization import async_require_admin
from custom_components.llm_lanes.chat import async_run_chat_log
from custom_components.llm_lanes.const import CONF_KIND, CONF_MODEL, CONF_POOL, DOMAIN
from custom_components.llm_lanes.coordinator import (
    ActivityCoordinator,
    LLMLanesConfigEntry,
    PollCoordinator,
)
from custom_components.llm_lanes.core.backends.kinds import ServerKind, server_profile
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.entry_defaults import default_names
from custom_components.llm_lanes.household import household_of
from custom_components.llm_lanes.jobs.manager import JobManager


async def async_lane_names(hass: HomeAssistant) -> dict[Lane, str]:
    """Return each lane's name in Home Assistant's language (``selector.lane.options``).

    Per-lane entities are named by one translation per figure, with the lane's name as the
    ``{lane}`` placeholder; a lane the language does not name shows its key.
    """
    names = await translation.async_get_translations(
        hass, hass.config.language, "selector", {DOMAIN}
    )
    return {
        lane: names.get(
            f"component.{DOMAIN}.selector.lane.options.{lane.key}", lane.key
        )
        for lane in LANES
    }


def options_applied_signal(entry_id: str) -> str:
    """Name the dispatcher signal sent once the entry's options run in its scheduler."""
    return f"{DOMAIN}_options_applied_{entry_id}"


def server_url(entry: LLMLanesConfigEntry) -> str:
    """Return the server's URL as the household may see it: without a user or password."""
    return str(URL(entry.data[CONF_URL]).with_user(None))


def server_device_info(entry: LLMLanesConfigEntry) -> DeviceInfo:
    """Describe the device that stands for the entry's LLM server."""
    server = entry.runtime_data.server
    kind = ServerKind(entry.data[CONF_KIND])
    version = server.data.info.version if server.data is not None else None
    return DeviceInfo(
        identifiers={(DOMAIN, entry.entry_id)},
        name=entry.title,
        manufacturer=server_profile(kind).name,
        model=entry.data[CONF_MODEL],
        sw_version=version,
        configuration_url=server_url(entry),
    )


class ServerDeviceEntity(Entity):
    """An entity on the device of one LLM server (the server's own, or the pool's on it)."""

    _attr_has_entity_name = True
    entry: LLMLanesConfigEntry

    def _attach(
        self, entry: LLMLanesConfigEntry, description: EntityDescription
    ) -> None:
        """Put the entity on ``entry``'s server device; the description's key makes its unique id."""
        self.entry = entry
        self.entity_description = description
        self._attr_unique_id = f"{entry.entry_id}_{description.key}"
        self._attr_device_info = server_device_info(entry)


class LLMLanesEntity[CoordinatorT: DataUpdateCoordinator[Any]](
    CoordinatorEntity[CoordinatorT], ServerDeviceEntity
):
    """An entity of one LLM server's device, fed by one of the entry's coordinators.

    Unavailable when its coordinator's last update failed or the server's last poll did; it
    writes its state when either coordinator updates.
    """

    def __init__(
        self,
        entry: LLMLanesConfigEntry,
        coordinator: CoordinatorT,
        description: EntityDescription,
    ) -> None:
        """Attach the entity to the server's device; the description's key makes its unique id."""
        super().__init__(coordinator)
        self._attach(entry, description)

    @property
    def available(self) -> bool:
        """Whether the coordinator's last update and the server's last poll succeeded."""
        return super().available and self.entry.runtime_data.server.last_update_success

    async def async_added_to_hass(self) -> None:
        """Also follow the server coordinator, when the entity reads the other one."""
        await super().async_added_to_hass()
        server = self.entry.runtime_data.server
        if self.coordinator is not server:
            self.async_on_remove(
                server.async_add_listener(self._handle_coordinator_update)
            )


class ServerEntity(LLMLanesEntity[PollCoordinator]):
    """An entity written on every poll of the server."""

    def __init__(
        self, entry: LLMLanesConfigEntry, description: EntityDescription
    ) -> None:
        """Follow the entry's server coordinator."""
        super().__init__(entry, entry.runtime_data.server, description)


class ActivityEntity(LLMLanesEntity[ActivityCoordinator]):
    """An entity whose state comes from the scheduler snapshots of its server."""

    def __init__(
        self, entry: LLMLanesConfigEntry, description: EntityDescription
    ) -> None:
        """Follow the entry's activity coordinator."""
        super().__init__(entry, entry.runtime_data.activity, description)


class SchedulerSettingEntity(ServerEntity):
    """A control that shows one scheduler setting and stores changes in the entry options.

    Its description's key is the option it is stored under; only an admin (or an automation)
    may change it, as the options. The entry's update listener applies
    stored options to the scheduler at once (``async_apply_options``), then signals it
    (``options_applied_signal``), so this entity shows every change of its setting, its own and
    the options flow's.
    """

    _attr_entity_category = EntityCategory.CONFIG

    @property
    def settings(self) -> SchedulerSettings:
        """The settings the scheduler runs with now."""
        return self.entry.runtime_data.scheduler.settings

    async def async_added_to_hass(self) -> None:
        """Show the settings again whenever the entry's options have been applied."""
        await super().async_added_to_hass()
        self.async_on_remove(
            async_dispatcher_connect(
                self.hass,
                options_applied_signal(self.entry.entry_id),
                self.async_write_ha_state,
            )
        )

    async def _async_store_option(self, value: Any) -> None:
        """Store the setting under its option (the description's key); the listener applies it.

        Admins only, as the options flow (``authorization``): a user who is not an admin is
        refused and nothing changes.
        """
        await async_require_admin(self.hass, self._context, entity_id=self.entity_id)
        self.hass.config_entries.async_update_entry(
            self.entry,
            options={**self.entry.options, self.entity_description.key: value},
        )


class JobEntity(ServerEntity):
    """An entity that reads the entry's job manager and is written when jobs change."""

    @property
    def manager(self) -> JobManager:
        """The entry's job manager."""
        return self.entry.runtime_data.jobs

    async def async_added_to_hass(self) -> None:
        """Follow the job manager."""
        await super().async_added_to_hass()
        self.async_on_remove(self.manager.add_listener(self.async_write_ha_state))


class LLMLanesSubentryEntity(ServerEntity):
    """An entity of one subentry (its own device, via the server's), sending through its scheduler.

    The entity is its device's: it takes the device's name. A subentry named after its server
    (the default, "llama.cpp on nas") names its device by what it is and which server
    (``name_key``: "llama.cpp on nas Conversation", "llama.cpp on nas AI Task", translated), so it
    is not taken for the server's device; one the user named ("Kitchen helper") is that name alone.
    """

    name_key: str
    """The translation key naming the device (``device.<name_key>.name``, ``{server}`` in it)."""

    def __init__(self, entry: LLMLanesConfigEntry, subentry: ConfigSubentry) -> None:
        """Put the entity on its subentry's device; name it by what it is, or by the device."""
        named_after_server = subentry.title in default_names(
            ServerKind(entry.data[CONF_KIND]), entry.data[CONF_URL]
        )
        super().__init__(entry, EntityDescription(key=subentry.subentry_id))
        self._attr_name = None
        self.subentry = subentry
        # A device belongs to one subentry, so each agent gets its own device, linked to the
        # server's device (``via_device_id``).
        server = server_device_info(entry)
        self._attr_device_info = DeviceInfo(
            identifiers={(DOMAIN, subentry.subentry_id)},
            manufacturer=server.get("manufacturer"),
            model=subentry.data.get(CONF_MODEL, entry.data[CONF_MODEL]),
            entry_type=DeviceEntryType.SERVICE,
            via_device_id=entry.runtime_data.device_id,
        )
        if named_after_server:
            self._attr_device_info["translation_key"] = self.name_key
            self._attr_device_info["translation_placeholders"] = {
                "server": subentry.title
            }
        else:
            self._attr_device_info["name"] = subentry.title

    @property
    def settings(self) -> dict[str, Any]:
        """The subentry's settings, over the entry's (model)."""
        return {**self.entry.data, **self.subentry.data}

    @property
    def uses_pool(self) -> bool:
        """Whether its requests go to the household's pool rather than this server alone."""
        return bool(self.subentry.data.get(CONF_POOL))

    @property
    def available(self) -> bool:
        """Whether it can answer: its server answers, or (set to the pool) always."""
        return self.uses_pool or super().available

    async def _async_answer(
        self,
        chat_log: conversation.ChatLog,
        *,
        lane: Lane,
        requester: str,
        json_schema: dict[str, Any] | None = None,
    ) -> None:
        """Answer the chat log through the server's scheduler (within the server's slot).

        A subentry set to the pool (``CONF_POOL``) answers through the household's pool.
        """
        runtime = self.entry.runtime_data
        await async_run_chat_log(
            household_of(self.hass).pool if self.uses_pool else runtime.scheduler,
            chat_log,
            agent_id=self.entity_id,
            settings=self.settings,
            lane=lane,
            requester=requester,
            json_schema=json_schema,
            context_per_slot=runtime.server.context_per_slot,
        )


type PlatformSetup = Callable[
    [HomeAssistant, LLMLanesConfigEntry, AddConfigEntryEntitiesCallback],
    Coroutine[Any, Any, None],
]
"""A platform's ``async_setup_entry``."""


def subentry_platform_setup(
    subentry_type: str,
    entity_factory: Callable[[LLMLanesConfigEntry, ConfigSubentry], Entity],
) -> PlatformSetup:
    """Build the ``async_setup_entry`` of a platform with one entity per subentry of a type."""

    async def async_setup_entry(
        hass: HomeAssistant,
        entry: LLMLanesConfigEntry,
        async_add_entities: AddConfigEntryEntitiesCallback,
    ) -> None:
        """Add one entity per subentry of the platform's type, each under its subentry."""
        for subentry in entry.subentries.values():
            if subentry.subentry_type == subentry_type:
                async_add_entities(
                    [entity_factory(entry, subentry)],
                    config_subentry_id=subentry.subentry_id,
                )

    return async_setup_entry
