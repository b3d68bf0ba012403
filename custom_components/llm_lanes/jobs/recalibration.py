"""A re-calibration planned for the night: ``run_benchmark`` with ``apply``, as a job would run.

The repair of a calibration that no longer holds plans one (``Calibration.planned``, stored).
It starts once the night's job window is open, the server answers, no job runs and the house is
quiet (``house_busy``: no voice or typed request waits or streams), as a job would; it replays
``SCENARIO`` for ``DURATION_S`` a setting, long enough to tell settings apart, and applies what
it finds only when that is measurably better (``core.bench.calibrate.decide``). Whatever it
decides, the plan is done; a failure (the server went away) is tried again after
``RETRY_AFTER``, still within a window.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers.event import async_track_time_interval
import homeassistant.util.dt as dt_util

from custom_components.llm_lanes.calibration import async_calibrate
from custom_components.llm_lanes.const import DOMAIN, LOGGER
from custom_components.llm_lanes.core.bench.calibrate import DEFAULT_SCENARIO
from custom_components.llm_lanes.jobs.throttles import house_busy

if TYPE_CHECKING:
    from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry

SCENARIO: Final = DEFAULT_SCENARIO
DURATION_S: Final = 120.0
"""Seconds a setting: about 25 finished requests of the evening scenario each."""
CHECK_INTERVAL: Final = timedelta(minutes=1)
RETRY_AFTER: Final = timedelta(minutes=15)


class NightlyRecalibration:
    """Runs the planned re-calibration of one entry in its night's job window."""

    def __init__(self, hass: HomeAssistant, entry: LLMLanesConfigEntry) -> None:
        """Watch ``entry`` (loaded); nothing runs before ``async_start``."""
        self.hass = hass
        self._entry = entry
        self.scenario = SCENARIO
        self.duration_s = DURATION_S
        """Seconds a setting of the calibration."""
        self._task: asyncio.Task[None] | None = None
        self._not_before: datetime | None = None
        self._unsub: CALLBACK_TYPE | None = None

    @callback
    def async_start(self) -> CALLBACK_TYPE:
        """Look every ``CHECK_INTERVAL`` whether it may run; return what stops that."""
        self._unsub = async_track_time_interval(
            self.hass, self._async_check, CHECK_INTERVAL, name=f"{DOMAIN} recalibration"
        )
        return self._async_stop

    @callback
    def _async_stop(self) -> None:
        if self._unsub is not None:
            self._unsub()
            self._unsub = None

    @property
    def running(self) -> bool:
        """Whether the calibration runs now."""
        return self._task is not None and not self._task.done()

    def may_start(self, now: datetime) -> bool:
        """Whether the planned calibration may start now (see the module docstring)."""
        runtime = self._entry.runtime_data
        jobs = runtime.jobs
        return (
            runtime.calibration.planned
            and not self.running
            and (self._not_before is None or now >= self._not_before)
            and jobs.settings.in_window(dt_util.as_local(now))
            and runtime.server.last_update_success
            and jobs.running_count == 0
            and not house_busy(
                runtime.scheduler.snapshot(), jobs.settings.goodput_objective
            )
        )

    @callback
    def _async_check(self, now: datetime) -> None:
        if self.may_start(now):
            self._task = self._entry.async_create_background_task(
                self.hass, self._async_run(), f"{DOMAIN} recalibration"
            )

    async def _async_run(self) -> None:
        LOGGER.info("Re-calibrating %s, as planned", self._entry.title)
        try:
            response = await async_calibrate(
                self.hass,
                self._entry,
                scenario=self.scenario,
                duration_s=self.duration_s,
                apply=True,
            )
        except HomeAssistantError as err:
            self._not_before = dt_util.utcnow() + RETRY_AFTER
            LOGGER.warning(
                "Re-calibrating %s failed (%s); trying again after %s",
                self._entry.title,
                err,
                RETRY_AFTER,
            )
            return
        LOGGER.info(
            "Re-calibrated %s: %s Applied: %s",
            self._entry.title,
            response["verdict_reason"],
            response["applied"] or "nothing",
        )
