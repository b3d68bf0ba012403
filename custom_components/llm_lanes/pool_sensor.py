"""Sensors of the household's pool, on each server's device: what the pool does with the servers.

Per server: its state in the pool (up, down, asleep, waking), the pool requests that ended well
on it and those that moved away from it after it failed (totals kept across restarts); per lane,
the server the lane's next request would go to now (the same on every server's device: the
household's choice, shown where the household looks). They come once the pool has two servers
(a single server has no choice to show), and stay from then on. They read the household
(``household.py``), at most once a second, and are available whatever the server does: a server
asleep is a state of the pool, not a missing reading.
"""

from __future__ import annotations

from collections.abc import Callable

from homeassistant.components.sensor import (
    RestoreSensor,
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.availability import ServerState
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.snapshot import MemberSnapshot
from custom_components.llm_lanes.entity import ServerDeviceEntity, async_lane_names
from custom_components.llm_lanes.household import Household, household_of

POOL_STATE_KEY = "pool_state"
POOL_SERVED_KEY = "pool_requests_served"
POOL_FAILOVERS_KEY = "pool_failovers"
LANE_SERVER_KEY = "{lane}_pool_server"
POOL_KEYS = (
    POOL_STATE_KEY,
    POOL_SERVED_KEY,
    POOL_FAILOVERS_KEY,
    *(LANE_SERVER_KEY.format(lane=lane.key) for lane in LANES),
)
"""The keys of every pool sensor of a server (their unique ids end with them)."""


async def async_setup_pool_sensors(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Add the server's pool sensors once the pool has two servers (or they existed before)."""
    home = household_of(hass)
    lane_names = await async_lane_names(hass)
    registry = er.async_get(hass)
    added = False

    @callback
    def add_when_pooled() -> None:
        nonlocal added
        if added:
            return
        known = any(
            registry.async_get_entity_id("sensor", DOMAIN, f"{entry.entry_id}_{key}")
            for key in POOL_KEYS
        )
        if len(home.members) < 2 and not known:
            return
        added = True
        async_add_entities(pool_sensors(home, entry, lane_names))

    entry.async_on_unload(home.add_listener(add_when_pooled))
    add_when_pooled()


def pool_sensors(
    home: Household, entry: LLMLanesConfigEntry, lane_names: dict[Lane, str]
) -> list[SensorEntity]:
    """Build the pool sensors of one server."""
    sensors: list[SensorEntity] = [
        PoolStateSensor(home, entry),
        PoolCountSensor(
            home, entry, POOL_SERVED_KEY, lambda member: member.served_total
        ),
        PoolCountSensor(
            home, entry, POOL_FAILOVERS_KEY, lambda member: member.failures_total
        ),
    ]
    sensors.extend(
        LaneServerSensor(home, entry, lane, lane_names[lane]) for lane in LANES
    )
    return sensors


class PoolSensor(ServerDeviceEntity, SensorEntity):
    """A sensor of the household's pool on one server's device."""

    _attr_should_poll = False

    def __init__(
        self,
        home: Household,
        entry: LLMLanesConfigEntry,
        description: SensorEntityDescription,
    ) -> None:
        """Show ``description`` of the pool on the device of ``entry``'s server."""
        self.home = home
        self._attach(entry, description)

    async def async_added_to_hass(self) -> None:
        """Follow the household."""
        await super().async_added_to_hass()
        self.async_on_remove(self.home.add_listener(self._async_pool_changed))

    @callback
    def _async_pool_changed(self) -> None:
        self.async_write_ha_state()

    @property
    def member(self) -> MemberSnapshot | None:
        """What the pool says of this server now (None: it is not in the pool)."""
        return self.home.snapshot().members.get(self.entry.entry_id)


class PoolStateSensor(PoolSensor):
    """Whether the pool has the server up, down, asleep or waking."""

    def __init__(self, home: Household, entry: LLMLanesConfigEntry) -> None:
        """Describe the server's state in the pool."""
        super().__init__(
            home,
            entry,
            SensorEntityDescription(
                key=POOL_STATE_KEY,
                translation_key=POOL_STATE_KEY,
                device_class=SensorDeviceClass.ENUM,
                options=[state.value for state in ServerState],
            ),
        )

    @property
    def native_value(self) -> str | None:
        """The state (None while the server is not in the pool)."""
        member = self.member
        return member.state.value if member is not None else None


class PoolCountSensor(PoolSensor, RestoreSensor):
    """A total of the pool's requests on this server, kept across restarts and re-joins.

    The pool counts from the server's joining (at its set-up); this sensor adds what it counts to
    the total it restored.
    """

    def __init__(
        self,
        home: Household,
        entry: LLMLanesConfigEntry,
        key: str,
        count: Callable[[MemberSnapshot], int],
    ) -> None:
        """Count ``count`` of the server's member snapshot."""
        super().__init__(
            home,
            entry,
            SensorEntityDescription(
                key=key,
                translation_key=key,
                state_class=SensorStateClass.TOTAL_INCREASING,
            ),
        )
        self._count = count
        self._total = 0
        self._seen = 0

    async def async_added_to_hass(self) -> None:
        """Restore the total from before the restart; add what the pool counted since."""
        await super().async_added_to_hass()
        if (data := await self.async_get_last_sensor_data()) is not None:
            try:
                self._total = max(0, int(float(str(data.native_value))))
            except ValueError:
                self._total = 0
        self._tally()

    def _now(self) -> int:
        member = self.member
        return self._count(member) if member is not None else 0

    def _tally(self) -> None:
        now = self._now()
        # A server that joined again counts from 0.
        self._total += now - self._seen if now >= self._seen else now
        self._seen = now

    @callback
    def _async_pool_changed(self) -> None:
        self._tally()
        super()._async_pool_changed()

    @property
    def native_value(self) -> int:
        """The total."""
        return self._total


class LaneServerSensor(PoolSensor):
    """The server a lane's next request would go to now (by its title)."""

    def __init__(
        self, home: Household, entry: LLMLanesConfigEntry, lane: Lane, lane_name: str
    ) -> None:
        """Show ``lane``'s choice, named after the lane."""
        super().__init__(
            home,
            entry,
            SensorEntityDescription(
                key=LANE_SERVER_KEY.format(lane=lane.key),
                translation_key="lane_pool_server",
                device_class=SensorDeviceClass.ENUM,
            ),
        )
        self.lane = lane
        self._attr_translation_placeholders = {"lane": lane_name}

    @property
    def options(self) -> list[str]:
        """The servers of the pool, by title."""
        return [entry.title for entry in self.home.members]

    @property
    def native_value(self) -> str | None:
        """The title of the server (None: no server of the lane is up)."""
        return self.home.title(self.home.snapshot().preferred.get(self.lane))
