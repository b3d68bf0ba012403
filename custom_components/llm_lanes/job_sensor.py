"""Sensors of the nightly jobs, on each server's device: what waits, what ran tonight, the budget.

They read the entry's job manager (``jobs.manager``), which tells them when its figures change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from homeassistant.components.sensor import (
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.const import PERCENTAGE, EntityCategory

from custom_components.llm_lanes.const import UNIT_TOKENS
from custom_components.llm_lanes.entity import JobEntity
from custom_components.llm_lanes.jobs.manager import JobManager

type SensorValue = float | int | str | None


@dataclass(frozen=True, kw_only=True)
class JobSensorDescription(SensorEntityDescription):
    """A sensor read from the entry's job manager."""

    value_fn: Callable[[JobManager], SensorValue]
    attributes_fn: Callable[[JobManager], dict[str, Any]] | None = None


def _budget_used(manager: JobManager) -> float | None:
    """Percent of the night's token budget used (None without a budget)."""
    budget = manager.settings.nightly_token_budget
    if budget <= 0:
        return None
    return min(100.0, 100.0 * manager.tokens_tonight / budget)


JOB_SENSORS: tuple[JobSensorDescription, ...] = (
    JobSensorDescription(
        key="jobs_waiting",
        translation_key="jobs_waiting",
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda manager: manager.waiting_count,
        attributes_fn=lambda manager: {
            "running": manager.running_count,
            "waiting_because": manager.waiting_because(),
        },
    ),
    JobSensorDescription(
        key="jobs_done_tonight",
        translation_key="jobs_done_tonight",
        state_class=SensorStateClass.TOTAL_INCREASING,
        value_fn=lambda manager: manager.done_tonight,
    ),
    JobSensorDescription(
        key="job_tokens_tonight",
        translation_key="job_tokens_tonight",
        native_unit_of_measurement=UNIT_TOKENS,
        state_class=SensorStateClass.TOTAL_INCREASING,
        value_fn=lambda manager: manager.tokens_tonight,
        attributes_fn=lambda manager: {
            "budget": manager.settings.nightly_token_budget or None,
            "budget_spent": manager.budget_spent,
        },
    ),
    JobSensorDescription(
        key="job_budget_used",
        translation_key="job_budget_used",
        native_unit_of_measurement=PERCENTAGE,
        suggested_display_precision=0,
        state_class=SensorStateClass.MEASUREMENT,
        entity_category=EntityCategory.DIAGNOSTIC,
        value_fn=_budget_used,
    ),
)


class JobSensor(JobEntity, SensorEntity):
    """A figure of the nightly jobs: what waits, what ran tonight, the night's budget."""

    entity_description: JobSensorDescription

    @property
    def native_value(self) -> SensorValue:
        """Read the figure from the job manager."""
        return self.entity_description.value_fn(self.manager)

    @property
    def extra_state_attributes(self) -> dict[str, Any] | None:
        """The details of the figure, where it has any."""
        attributes_fn = self.entity_description.attributes_fn
        return attributes_fn(self.manager) if attributes_fn is not None else None
