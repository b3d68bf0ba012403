"""Entities of the job system: what waits, what ran tonight, and a switch to pause it all.

The platform files add them with ``job_sensors(entry)`` and ``job_switches(entry)``. They follow
the entry's ``JobManager``, which tells them when jobs or the night's counters change.
"""

from __future__ import annotations

from typing import Any

from homeassistant.components.sensor import SensorEntity, SensorStateClass
from homeassistant.components.switch import SwitchEntity
from homeassistant.const import PERCENTAGE, EntityCategory

from .entity import LLMLanesEntity
from .jobs import JobManager
from .models import LLMLanesConfigEntry


class JobEntity(LLMLanesEntity):
    """An entity that reads the entry's job manager and updates when it changes."""

    _attr_should_poll = False

    def __init__(self, entry: LLMLanesConfigEntry, key: str) -> None:
        """Name the entity by its translation key."""
        super().__init__(entry, key)
        self._attr_translation_key = key

    @property
    def manager(self) -> JobManager:
        """The entry's job manager."""
        return self.entry.runtime_data.jobs

    async def async_added_to_hass(self) -> None:
        """Follow the job manager."""
        await super().async_added_to_hass()
        self.async_on_remove(self.manager.add_listener(self.async_write_ha_state))


class JobsWaitingSensor(JobEntity, SensorEntity):
    """Queued jobs; the attributes say why they wait."""

    _attr_state_class = SensorStateClass.MEASUREMENT
    _attr_native_unit_of_measurement = "jobs"

    @property
    def native_value(self) -> int:
        """How many jobs are queued."""
        return self.manager.waiting_count

    @property
    def extra_state_attributes(self) -> dict[str, Any]:
        """How many run now, and how many wait for each reason."""
        reasons: dict[str, int] = {}
        for job in self.manager.jobs():
            if job.wait_reason is not None and not job.status.finished:
                reasons[job.wait_reason.value] = (
                    reasons.get(job.wait_reason.value, 0) + 1
                )
        return {"running": self.manager.running_count, "waiting_because": reasons}


class JobsDoneTonightSensor(JobEntity, SensorEntity):
    """Jobs finished since the run window last opened."""

    _attr_state_class = SensorStateClass.TOTAL_INCREASING
    _attr_native_unit_of_measurement = "jobs"

    @property
    def native_value(self) -> int:
        """How many jobs finished tonight."""
        return self.manager.done_tonight


class JobTokensTonightSensor(JobEntity, SensorEntity):
    """Tokens jobs used since the run window last opened, with the night's budget."""

    _attr_state_class = SensorStateClass.TOTAL_INCREASING
    _attr_native_unit_of_measurement = "tokens"

    @property
    def native_value(self) -> int:
        """Tokens used tonight."""
        return self.manager.tokens_tonight

    @property
    def extra_state_attributes(self) -> dict[str, Any]:
        """The night's budget (None when unlimited) and whether it is spent."""
        budget = self.manager.settings.nightly_token_budget
        return {"budget": budget or None, "budget_spent": self.manager.budget_spent}


class JobBudgetUsedSensor(JobEntity, SensorEntity):
    """Share of the night's token budget used (unknown when there is no budget)."""

    _attr_native_unit_of_measurement = PERCENTAGE
    _attr_state_class = SensorStateClass.MEASUREMENT
    _attr_suggested_display_precision = 0
    _attr_entity_category = EntityCategory.DIAGNOSTIC

    @property
    def native_value(self) -> float | None:
        """Percent of the budget used."""
        budget = self.manager.settings.nightly_token_budget
        if budget <= 0:
            return None
        return min(100.0, 100.0 * self.manager.tokens_tonight / budget)


class JobsPausedSwitch(JobEntity, SwitchEntity):
    """When on, no job starts (running ones finish); kept across restarts."""

    _attr_entity_category = EntityCategory.CONFIG

    @property
    def is_on(self) -> bool:
        """Whether jobs are paused."""
        return self.manager.paused

    async def async_turn_on(self, **kwargs: Any) -> None:
        """Pause the jobs."""
        self.manager.set_paused(True)

    async def async_turn_off(self, **kwargs: Any) -> None:
        """Let the jobs run again."""
        self.manager.set_paused(False)


def job_sensors(entry: LLMLanesConfigEntry) -> list[SensorEntity]:
    """Return the job sensors of an entry (for ``sensor.py``)."""
    return [
        JobsWaitingSensor(entry, "jobs_waiting"),
        JobsDoneTonightSensor(entry, "jobs_done_tonight"),
        JobTokensTonightSensor(entry, "job_tokens_tonight"),
        JobBudgetUsedSensor(entry, "job_budget_used"),
    ]


def job_switches(entry: LLMLanesConfigEntry) -> list[SwitchEntity]:
    """Return the job switches of an entry (for ``switch.py``)."""
    return [JobsPausedSwitch(entry, "jobs_paused")]
