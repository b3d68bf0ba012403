"""Scheduler activity for Home Assistant: throttled snapshots and the request-finished event.

The scheduler tells us when a request leaves it; we never look at individual tokens. Each finished
request fires ``llm_lanes_request_finished`` and asks for a snapshot refresh, and refreshes go
through one debouncer, so the entities of a server are updated at most once a second however busy
it is. A timer also refreshes every few seconds while requests are queued or in flight (so queue
depth and in-flight sensors move during long generations), and more slowly when idle (so windowed
rates decay to zero and newly started requests show up).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.helpers.debounce import Debouncer
from homeassistant.helpers.event import async_call_later
from homeassistant.helpers.update_coordinator import (
    CoordinatorEntity,
    DataUpdateCoordinator,
)

from .const import DOMAIN, EVENT_REQUEST_FINISHED, LOGGER
from .core.snapshot import FinishedRequest, SchedulerSnapshot
from .entity import LLMLanesEntity

if TYPE_CHECKING:
    from .core.scheduler import Scheduler
    from .models import LLMLanesConfigEntry

REFRESH_COOLDOWN_S = 1.0
"""The shortest time between two snapshots of one server."""
BUSY_REFRESH_INTERVAL = timedelta(seconds=2)
"""How often to take a snapshot while something is queued or in flight."""
IDLE_REFRESH_INTERVAL = timedelta(seconds=10)
"""How often to take a snapshot while the scheduler is idle."""


def request_finished_event_data(
    entry_id: str, finished: FinishedRequest
) -> dict[str, Any]:
    """Build the data of ``llm_lanes_request_finished`` (never any prompt or answer text)."""
    return {
        "config_entry_id": entry_id,
        "request_id": finished.request_id,
        "lane": finished.lane.key,
        "requester": finished.requester,
        "outcome": finished.outcome,
        "error": finished.error,
        "queue_wait_s": finished.queue_wait_s,
        "ttft_s": finished.ttft_s,
        "itl_p95_s": finished.itl_p95_s,
        "e2e_s": finished.e2e_s,
        "prompt_tokens": finished.prompt_tokens,
        "output_tokens": finished.output_tokens,
        "token_source": finished.token_source,
        "preemptions": finished.preemptions,
        "met_ttft": finished.met_ttft,
        "met_itl": finished.met_itl,
        "met_objectives": finished.met_objectives,
    }


class ActivityCoordinator(DataUpdateCoordinator[SchedulerSnapshot]):
    """Holds the latest scheduler snapshot of one server, refreshed at most once a second."""

    config_entry: LLMLanesConfigEntry

    def __init__(
        self, hass: HomeAssistant, entry: LLMLanesConfigEntry, scheduler: Scheduler
    ) -> None:
        """Follow ``scheduler``; nothing happens until ``async_setup``."""
        super().__init__(
            hass,
            LOGGER,
            config_entry=entry,
            name=f"{DOMAIN} activity {entry.title}",
            update_interval=None,
            request_refresh_debouncer=Debouncer(
                hass, LOGGER, cooldown=REFRESH_COOLDOWN_S, immediate=True
            ),
        )
        self.scheduler = scheduler
        self._unsub_timer: CALLBACK_TYPE | None = None

    async def async_setup(self) -> None:
        """Take the first snapshot and start listening to finished requests."""
        self.config_entry.async_on_unload(
            self.scheduler.add_listener(self._async_request_finished)
        )
        await self.async_config_entry_first_refresh()

    async def _async_update_data(self) -> SchedulerSnapshot:
        """Take a snapshot (cheap, in memory) and plan the next timed one."""
        snapshot = self.scheduler.snapshot()
        self._schedule_timer(
            BUSY_REFRESH_INTERVAL
            if snapshot.queue_depth or snapshot.in_flight
            else IDLE_REFRESH_INTERVAL
        )
        return snapshot

    async def async_shutdown(self) -> None:
        """Stop the timer with the coordinator."""
        self._cancel_timer()
        await super().async_shutdown()

    @callback
    def async_schedule_refresh(self) -> None:
        """Ask for a snapshot soon, respecting the one-second cooldown."""
        self._debounced_refresh.async_schedule_call()

    @callback
    def _async_request_finished(self, finished: FinishedRequest) -> None:
        """Fire the event for one finished request and ask for a fresh snapshot."""
        self.hass.bus.async_fire(
            EVENT_REQUEST_FINISHED,
            request_finished_event_data(self.config_entry.entry_id, finished),
        )
        self.async_schedule_refresh()

    @callback
    def _schedule_timer(self, delay: timedelta) -> None:
        self._cancel_timer()
        self._unsub_timer = async_call_later(self.hass, delay, self._async_timer_fired)

    @callback
    def _async_timer_fired(self, _now: Any) -> None:
        self._unsub_timer = None
        self.async_schedule_refresh()

    @callback
    def _cancel_timer(self) -> None:
        if self._unsub_timer is not None:
            self._unsub_timer()
            self._unsub_timer = None


class ActivityEntity(LLMLanesEntity, CoordinatorEntity[ActivityCoordinator]):
    """An entity whose state comes from the scheduler snapshots of its server.

    Unavailable when the server is unreachable (``LLMLanesEntity``) or the last snapshot failed.
    """

    def __init__(self, entry: LLMLanesConfigEntry, key: str) -> None:
        """Attach the entity to the server's device and its activity coordinator."""
        LLMLanesEntity.__init__(self, entry, key)
        CoordinatorEntity.__init__(self, entry.runtime_data.activity)
