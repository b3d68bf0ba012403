"""Sensors of an LLM server: latency per lane, load, throughput, goodput, tokens, nightly jobs.

Scheduler figures come from the activity coordinator's snapshots, server figures from the server
coordinator's polls, job figures from the entry's job manager (``job_sensor.py``); one token
sensor per requester is added when the requester first appears (or at set-up, for those known
before a restart), up to ``MAX_REQUESTER_SENSORS`` per server (the actions already fold passing
requesters into ``other``).
The requests each lane served and the requesters' tokens are totals kept across restarts; the
server's URL is a diagnostic sensor, so the device page shows it as text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from homeassistant.components.sensor import (
    RestoreSensor,
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.const import PERCENTAGE, EntityCategory, UnitOfTime
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from custom_components.llm_lanes.const import LOGGER, UNIT_TOKENS
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry, PollResult
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.snapshot import LaneSnapshot, SchedulerSnapshot
from custom_components.llm_lanes.entity import (
    ActivityEntity,
    ServerEntity,
    async_lane_names,
    server_url,
)
from custom_components.llm_lanes.job_sensor import JOB_SENSORS, JobSensor
from custom_components.llm_lanes.pool_sensor import async_setup_pool_sensors
from custom_components.llm_lanes.requesters import (
    REQUESTER_TOKENS_KEY,
    async_requester_name,
    requesters_with_sensors,
)

PARALLEL_UPDATES = 0

UNIT_TOKENS_PER_SECOND = "tokens/s"
MAX_REQUESTER_SENSORS = 200
"""Token sensors of one server; requesters past it are counted by the scheduler only."""

type SensorValue = float | int | str | None


@dataclass(frozen=True, kw_only=True)
class ActivitySensorDescription(SensorEntityDescription):
    """A sensor read from the scheduler snapshot."""

    value_fn: Callable[[SchedulerSnapshot], SensorValue]
    lane: Lane | None = None
    """The lane a per-lane figure is of: its translated name fills ``{lane}`` in the name."""


@dataclass(frozen=True, kw_only=True)
class ServerSensorDescription(SensorEntityDescription):
    """A sensor read from what the server reports."""

    exists_fn: Callable[[PollResult], bool] = lambda _: True
    value_fn: Callable[[PollResult], SensorValue]


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

    Each is named by one translation per figure with the lane's name as a placeholder; its key
    (and so its unique id) is the lane's key and the figure's. The foreground lanes' TTFT p95 and
    ITL p95 (voice, and the typed chats and gateway clients of interactive) are what a household
    notices, and what the dashboard graphs; the other figures are for tuning, so they start
    disabled.
    """

    def latency(
        name: str, read: Callable[[LaneSnapshot], float | None], *, enabled: bool
    ) -> ActivitySensorDescription:
        return ActivitySensorDescription(
            key=f"{lane.key}_{name}",
            translation_key=f"lane_{name}",
            lane=lane,
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
        latency("ttft_p95", lambda s: s.ttft_p95_s, enabled=lane.foreground),
        latency("itl_p95", lambda s: s.itl_p95_s, enabled=lane.foreground),
        latency("e2e_p95", lambda s: s.e2e_p95_s, enabled=False),
        ActivitySensorDescription(
            key=f"{lane.key}_queue_depth",
            translation_key="lane_queue_depth",
            lane=lane,
            state_class=SensorStateClass.MEASUREMENT,
            entity_registry_enabled_default=False,
            value_fn=_lane_value(lane, lambda s: s.queue_depth),
        ),
    )


def _requests_served(lane: Lane) -> ActivitySensorDescription:
    """Describe the total of requests a lane served, whatever their outcome (``LaneRequestsSensor``)."""
    return ActivitySensorDescription(
        key=f"{lane.key}_requests_served",
        translation_key="lane_requests_served",
        lane=lane,
        state_class=SensorStateClass.TOTAL_INCREASING,
        value_fn=_lane_value(lane, lambda s: s.finished_total),
    )


LANE_REQUESTS_SENSORS: tuple[ActivitySensorDescription, ...] = tuple(
    _requests_served(lane) for lane in LANES
)


ACTIVITY_SENSORS: tuple[ActivitySensorDescription, ...] = (
    *(description for lane in LANES for description in _lane_descriptions(lane)),
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


def _loaded_model(state: PollResult) -> str | None:
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
        # llama.cpp's /slots (llama-server --slots): the slots processing a request now, as the
        # server counts them (a request sent past LLM Lanes counts too).
        key="slots_busy",
        translation_key="slots_busy",
        state_class=SensorStateClass.MEASUREMENT,
        entity_category=EntityCategory.DIAGNOSTIC,
        exists_fn=lambda state: state.metrics.slots_busy is not None,
        value_fn=lambda state: state.metrics.slots_busy,
    ),
    ServerSensorDescription(
        key="loaded_model",
        translation_key="loaded_model",
        value_fn=_loaded_model,
    ),
)


async def async_setup_entry(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the sensors of one server, then one token sensor per requester as they appear."""
    server_state = entry.runtime_data.server.data
    lane_names = await async_lane_names(hass)
    entities: list[SensorEntity] = [
        ActivitySensor(entry, description, lane_names)
        for description in ACTIVITY_SENSORS
    ]
    entities.extend(
        LaneRequestsSensor(entry, description, lane_names)
        for description in LANE_REQUESTS_SENSORS
    )
    entities.append(ServerURLSensor(entry))
    entities.extend(
        ServerSensor(entry, description)
        for description in SERVER_SENSORS
        # A server set up asleep (the pool wakes it) has said nothing yet: all of them.
        if server_state is None or description.exists_fn(server_state)
    )
    entities.extend(JobSensor(entry, description) for description in JOB_SENSORS)
    async_add_entities(entities)
    await async_setup_pool_sensors(hass, entry, async_add_entities)

    activity = entry.runtime_data.activity
    # Requesters seen before a restart keep their sensor (and its restored count).
    known = requesters_with_sensors(hass, entry.entry_id)

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

    left_out: set[str] = set()

    @callback
    def async_add_new_requesters() -> None:
        new = sorted(set(activity.data.requesters) - known - left_out)
        room = max(0, MAX_REQUESTER_SENSORS - len(known))
        if len(new) > room:
            LOGGER.warning(
                "%s has %s requester token sensors, the most it makes; %s more get none",
                entry.title,
                MAX_REQUESTER_SENSORS,
                len(new) - room,
            )
            left_out.update(new[room:])
            new = new[:room]
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
        self,
        entry: LLMLanesConfigEntry,
        description: ActivitySensorDescription,
        lane_names: Mapping[Lane, str],
    ) -> None:
        """Follow the entry's scheduler; a per-lane figure is named with its lane's name."""
        super().__init__(entry, description)
        if description.lane is not None:
            self._attr_translation_placeholders = {
                "lane": lane_names.get(description.lane, description.lane.key)
            }

    @property
    def native_value(self) -> SensorValue:
        """Read the figure from the latest snapshot."""
        return self.entity_description.value_fn(self.coordinator.data)


class ServerSensor(ServerEntity, SensorEntity):
    """What the server itself reports (written on every server poll)."""

    entity_description: ServerSensorDescription

    @property
    def native_value(self) -> SensorValue:
        """Read the figure from the last successful poll."""
        return self.entity_description.value_fn(self.coordinator.data)


class ServerURLSensor(ServerEntity, SensorEntity):
    """The URL Home Assistant reaches the server at (without any user and password in it).

    The device page links the configuration URL (its *Visit* button) without showing it; this
    shows it, and keeps showing it while the server is down, when it matters most.
    """

    _attr_entity_category = EntityCategory.DIAGNOSTIC

    def __init__(self, entry: LLMLanesConfigEntry) -> None:
        """Show the entry's URL."""
        super().__init__(
            entry,
            SensorEntityDescription(key="server_url", translation_key="server_url"),
        )
        self._attr_native_value = server_url(entry)

    @property
    def available(self) -> bool:
        """Always: the URL is configuration, not a reading of the server."""
        return True


def _as_count(value: Any) -> int:
    """Read a restored count; anything that is not a number (unknown, unavailable) counts 0."""
    try:
        return max(0, int(float(str(value))))
    except ValueError:
        return 0


async def _async_restored_count(sensor: RestoreSensor) -> int:
    """Read a total's count from before the restart (its own stored data, else its last state)."""
    if (sensor_data := await sensor.async_get_last_sensor_data()) is not None:
        return _as_count(sensor_data.native_value)
    if (state := await sensor.async_get_last_state()) is not None:
        return _as_count(state.state)
    return 0


class LaneRequestsSensor(ActivitySensor, RestoreSensor):
    """Requests one lane served, kept across restarts (the scheduler counts from its start)."""

    _restored = 0

    async def async_added_to_hass(self) -> None:
        """Restore the count from before the restart."""
        await super().async_added_to_hass()
        self._restored = await _async_restored_count(self)

    @property
    def native_value(self) -> int:
        """Restored count plus what this scheduler has served since it started."""
        served = self.entity_description.value_fn(self.coordinator.data)
        return self._restored + (served if isinstance(served, int) else 0)


class RequesterTokensSensor(ActivityEntity, RestoreSensor):
    """Tokens (prompt and output) one requester has used, kept across restarts."""

    def __init__(self, entry: LLMLanesConfigEntry, requester: str, name: str) -> None:
        """Count ``requester``'s tokens; ``name`` is how the household knows it."""
        super().__init__(
            entry,
            SensorEntityDescription(
                key=f"{REQUESTER_TOKENS_KEY}_{requester}",
                translation_key=REQUESTER_TOKENS_KEY,
                native_unit_of_measurement=UNIT_TOKENS,
                state_class=SensorStateClass.TOTAL_INCREASING,
                suggested_display_precision=0,
            ),
        )
        self.requester = requester
        self._attr_translation_placeholders = {"requester": name}
        self._restored = 0
        """Count before this scheduler started (restored from the last state)."""

    async def async_added_to_hass(self) -> None:
        """Restore the count from before the restart."""
        await super().async_added_to_hass()
        self._restored = await _async_restored_count(self)

    @property
    def native_value(self) -> int:
        """Restored count plus what this scheduler has counted since it started."""
        snapshot = self.coordinator.data.requesters.get(self.requester)
        if snapshot is None:
            return self._restored
        return (
            self._restored + snapshot.prompt_tokens_total + snapshot.output_tokens_total
        )
