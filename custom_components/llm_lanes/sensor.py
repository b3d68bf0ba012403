"""Sensors of an LLM server: latency per lane, load, throughput, goodput and tokens per requester."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from homeassistant.components.sensor import (
    RestoreSensor,
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.const import (
    ATTR_FRIENDLY_NAME,
    PERCENTAGE,
    EntityCategory,
    UnitOfTime,
)
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import device_registry as dr, entity_registry as er
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .activity import ActivityEntity
from .core.lanes import Lane
from .entity import LLMLanesEntity
from .job_entities import job_sensors

if TYPE_CHECKING:
    from .coordinator import ServerState
    from .core.snapshot import LaneSnapshot, SchedulerSnapshot
    from .models import LLMLanesConfigEntry

PARALLEL_UPDATES = 0

UNIT_TOKENS = "tokens"
UNIT_TOKENS_PER_SECOND = "tokens/s"
REQUESTER_TOKENS_KEY = "requester_tokens"
"""Prefix of the key (and unique id suffix) of a per-requester token sensor."""

type SensorValue = float | int | str | None


@dataclass(frozen=True, kw_only=True)
class ActivitySensorDescription(SensorEntityDescription):
    """A sensor read from the scheduler snapshot."""

    value_fn: Callable[[SchedulerSnapshot], SensorValue]


@dataclass(frozen=True, kw_only=True)
class ServerSensorDescription(SensorEntityDescription):
    """A sensor read from what the server reports."""

    exists_fn: Callable[[ServerState], bool] = lambda _: True
    value_fn: Callable[[ServerState], SensorValue]


def _lane_value(
    lane: Lane, read: Callable[[LaneSnapshot], float | int | None]
) -> Callable[[SchedulerSnapshot], SensorValue]:
    """Read one figure of one lane (None when the snapshot has no such lane)."""

    def value(snapshot: SchedulerSnapshot) -> SensorValue:
        lane_snapshot = snapshot.lanes.get(lane)
        return None if lane_snapshot is None else read(lane_snapshot)

    return value


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else round(fraction * 100, 2)


def _lane_descriptions(lane: Lane) -> tuple[ActivitySensorDescription, ...]:
    """Describe the latency and queue sensors of one lane.

    Voice TTFT p95 is what a household notices; the other figures are for tuning, so they start
    disabled.
    """

    def latency(
        name: str, read: Callable[[LaneSnapshot], float | None], *, enabled: bool
    ) -> ActivitySensorDescription:
        return ActivitySensorDescription(
            key=f"{lane.key}_{name}",
            translation_key=f"{lane.key}_{name}",
            device_class=SensorDeviceClass.DURATION,
            native_unit_of_measurement=UnitOfTime.SECONDS,
            suggested_unit_of_measurement=UnitOfTime.MILLISECONDS,
            suggested_display_precision=0,
            state_class=SensorStateClass.MEASUREMENT,
            entity_registry_enabled_default=enabled,
            value_fn=_lane_value(lane, read),
        )

    return (
        latency("ttft_p50", lambda s: s.ttft_p50_s, enabled=False),
        latency("ttft_p95", lambda s: s.ttft_p95_s, enabled=True),
        latency("itl_p95", lambda s: s.itl_p95_s, enabled=False),
        latency("e2e_p95", lambda s: s.e2e_p95_s, enabled=False),
        ActivitySensorDescription(
            key=f"{lane.key}_queue_depth",
            translation_key=f"{lane.key}_queue_depth",
            state_class=SensorStateClass.MEASUREMENT,
            entity_registry_enabled_default=False,
            value_fn=_lane_value(lane, lambda s: s.queue_depth),
        ),
    )


ACTIVITY_SENSORS: tuple[ActivitySensorDescription, ...] = (
    *(description for lane in Lane for description in _lane_descriptions(lane)),
    ActivitySensorDescription(
        key="queue_depth",
        translation_key="queue_depth",
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: s.queue_depth,
    ),
    ActivitySensorDescription(
        key="in_flight",
        translation_key="in_flight",
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: s.in_flight,
    ),
    ActivitySensorDescription(
        key="output_tokens_per_second",
        translation_key="output_tokens_per_second",
        native_unit_of_measurement=UNIT_TOKENS_PER_SECOND,
        suggested_display_precision=1,
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: round(s.output_tok_s, 2),
    ),
    ActivitySensorDescription(
        key="prompt_tokens_per_second",
        translation_key="prompt_tokens_per_second",
        native_unit_of_measurement=UNIT_TOKENS_PER_SECOND,
        suggested_display_precision=1,
        state_class=SensorStateClass.MEASUREMENT,
        entity_registry_enabled_default=False,
        value_fn=lambda s: round(s.prompt_tok_s, 2),
    ),
    ActivitySensorDescription(
        key="goodput",
        translation_key="goodput",
        native_unit_of_measurement=PERCENTAGE,
        suggested_display_precision=0,
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: _percent(s.goodput),
    ),
    ActivitySensorDescription(
        key="rejected_requests",
        translation_key="rejected_requests",
        state_class=SensorStateClass.TOTAL_INCREASING,
        entity_category=EntityCategory.DIAGNOSTIC,
        value_fn=lambda s: s.rejected_total,
    ),
    ActivitySensorDescription(
        key="preemptions",
        translation_key="preemptions",
        state_class=SensorStateClass.TOTAL_INCREASING,
        entity_category=EntityCategory.DIAGNOSTIC,
        value_fn=lambda s: s.preemptions_total,
    ),
)


def _loaded_model(state: ServerState) -> str | None:
    loaded = state.metrics.loaded_models or state.info.loaded_models
    # A state holds at most 255 characters; a server with many resident models is cut short.
    return ", ".join(loaded)[:255] if loaded else None


SERVER_SENSORS: tuple[ServerSensorDescription, ...] = (
    ServerSensorDescription(
        key="kv_cache_usage",
        translation_key="kv_cache_usage",
        native_unit_of_measurement=PERCENTAGE,
        suggested_display_precision=0,
        state_class=SensorStateClass.MEASUREMENT,
        entity_category=EntityCategory.DIAGNOSTIC,
        exists_fn=lambda state: state.metrics.kv_cache_usage is not None,
        value_fn=lambda state: _percent(state.metrics.kv_cache_usage),
    ),
    ServerSensorDescription(
        key="loaded_model",
        translation_key="loaded_model",
        value_fn=_loaded_model,
    ),
)


async def async_requester_name(hass: HomeAssistant, requester: str) -> str:
    """Name a requester as the household knows it: the HA user, satellite or automation.

    Falls back to the requester id when it names nothing Home Assistant knows.
    """
    kind, _, ident = requester.partition(":")
    name: str | None = None
    if kind == "user" and ident:
        if (user := await hass.auth.async_get_user(ident)) is not None:
            name = user.name
    elif kind == "device" and ident:
        if (device := dr.async_get(hass).async_get(ident)) is not None:
            name = device.name_by_user or device.name
    elif kind == "automation" and ident:
        if (state := hass.states.get(ident)) is not None:
            name = state.attributes.get(ATTR_FRIENDLY_NAME)
        elif (registry_entry := er.async_get(hass).async_get(ident)) is not None:
            name = registry_entry.name or registry_entry.original_name
    elif kind == "job" and ident:
        name = ident
    elif requester == "ai_task":
        name = "AI Task"
    return str(name) if name else requester


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the sensors of one server, then one token sensor per requester as they appear."""
    server_state = entry.runtime_data.server.data
    entities: list[SensorEntity] = [
        ActivitySensor(entry, description) for description in ACTIVITY_SENSORS
    ]
    entities.extend(
        ServerSensor(entry, description)
        for description in SERVER_SENSORS
        if description.exists_fn(server_state)
    )
    entities.extend(job_sensors(entry))
    async_add_entities(entities)

    activity = entry.runtime_data.activity
    prefix = f"{entry.entry_id}_{REQUESTER_TOKENS_KEY}_"
    # Requesters seen before a restart keep their sensor (and its restored count).
    known: set[str] = {
        registry_entry.unique_id.removeprefix(prefix)
        for registry_entry in er.async_entries_for_config_entry(
            er.async_get(hass), entry.entry_id
        )
        if registry_entry.domain == "sensor"
        and registry_entry.unique_id.startswith(prefix)
    }

    async def async_add_requesters(requesters: Iterable[str]) -> None:
        async_add_entities(
            [
                RequesterTokensSensor(
                    entry, requester, await async_requester_name(hass, requester)
                )
                for requester in requesters
            ]
        )

    await async_add_requesters(sorted(known))

    @callback
    def async_add_new_requesters() -> None:
        new = sorted(set(activity.data.requesters) - known)
        if not new:
            return
        known.update(new)
        entry.async_create_task(
            hass, async_add_requesters(new), "llm_lanes add requester sensors"
        )

    entry.async_on_unload(activity.async_add_listener(async_add_new_requesters))
    async_add_new_requesters()


class ActivitySensor(ActivityEntity, SensorEntity):
    """A figure of the scheduler: latency, queue, throughput, goodput, counters."""

    entity_description: ActivitySensorDescription

    def __init__(
        self, entry: LLMLanesConfigEntry, description: ActivitySensorDescription
    ) -> None:
        """Describe one figure of the entry's scheduler."""
        super().__init__(entry, description.key)
        self.entity_description = description

    @property
    def native_value(self) -> SensorValue:
        """Read the figure from the latest snapshot."""
        return self.entity_description.value_fn(self.coordinator.data)


class ServerSensor(LLMLanesEntity, SensorEntity):
    """What the server itself reports (written on every server poll)."""

    _attr_should_poll = False
    entity_description: ServerSensorDescription

    def __init__(
        self, entry: LLMLanesConfigEntry, description: ServerSensorDescription
    ) -> None:
        """Describe one figure the server reports."""
        super().__init__(entry, description.key)
        self.entity_description = description

    @property
    def native_value(self) -> SensorValue:
        """Read the figure from the last successful poll."""
        return self.entity_description.value_fn(self.entry.runtime_data.server.data)


def _as_count(value: Any) -> int:
    """Read a restored count; anything that is not a number (unknown, unavailable) counts 0."""
    try:
        return max(0, int(float(str(value))))
    except ValueError:
        return 0


class RequesterTokensSensor(ActivityEntity, RestoreSensor):
    """Tokens (prompt and output) one requester has used, kept across restarts."""

    _attr_translation_key = REQUESTER_TOKENS_KEY
    _attr_native_unit_of_measurement = UNIT_TOKENS
    _attr_state_class = SensorStateClass.TOTAL_INCREASING
    _attr_suggested_display_precision = 0

    def __init__(self, entry: LLMLanesConfigEntry, requester: str, name: str) -> None:
        """Count ``requester``'s tokens; ``name`` is how the household knows it."""
        super().__init__(entry, f"{REQUESTER_TOKENS_KEY}_{requester}")
        self.requester = requester
        self._attr_translation_placeholders = {"requester": name}
        self._restored = 0
        """Count before this scheduler started (restored from the last state)."""

    async def async_added_to_hass(self) -> None:
        """Restore the count from before the restart."""
        await super().async_added_to_hass()
        last: Any = None
        if (sensor_data := await self.async_get_last_sensor_data()) is not None:
            last = sensor_data.native_value
        elif (state := await self.async_get_last_state()) is not None:
            last = state.state
        self._restored = _as_count(last)

    @property
    def native_value(self) -> int:
        """Restored count plus what this scheduler has counted since it started."""
        snapshot = self.coordinator.data.requesters.get(self.requester)
        if snapshot is None:
            return self._restored
        return (
            self._restored + snapshot.prompt_tokens_total + snapshot.output_tokens_total
        )
