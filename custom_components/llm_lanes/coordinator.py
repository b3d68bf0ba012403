"""The two coordinators of an LLM server entry, and what a loaded entry holds at run time.

``PollCoordinator`` polls the server's health, identity and live load, and keeps its model
loaded. Its poll interval says whether the server answers: ``SERVER_POLL_INTERVAL`` while it does,
``DOWN_POLL_INTERVAL`` (seconds) while it does not, so "Server reachable" follows the server within
seconds. Requests tell it sooner than a poll would: one that cannot connect marks the server down
at once (and has it polled), one that times out or is cut short has the server polled at once.

``ActivityCoordinator`` holds the scheduler's snapshots and fires the request-finished event (of
the requests sent to this server itself: the household's pool reports its own). It
polls nothing: snapshots are pushed to it, through one debouncer, so a server's entities are
updated at most once a second however busy it is. The scheduler tells it when a request leaves,
never about individual tokens, and a timer asks for a snapshot every few seconds while requests
are queued or in flight (so queue depth and in-flight sensors move during long generations), and
more slowly when idle (so windowed rates decay to zero and newly started requests show up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final, Protocol

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.debounce import Debouncer
from homeassistant.helpers.event import async_call_later
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed
from homeassistant.util import dt as dt_util

from custom_components.llm_lanes.calibration_record import Calibration
from custom_components.llm_lanes.const import (
    CONF_MODEL,
    DOMAIN,
    EVENT_REQUEST_FINISHED,
    LOGGER,
    SERVER_POLL_INTERVAL,
)
from custom_components.llm_lanes.core.backends.base import Backend, ServerInfo
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.core.errors import (
    SERVER_DOWN_ERRORS,
    SERVER_SUSPECT_ERRORS,
    AuthError,
    BackendError,
)
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.snapshot import FinishedRequest, SchedulerSnapshot
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.request_events import request_finished_event_data
from custom_components.llm_lanes.requesters import RequesterRegistry
from custom_components.llm_lanes.served_model import (
    ServedModel,
    model_is_loaded,
    variant_of,
)


class Recalibration(Protocol):
    """What the set-up starts with the entry: its nightly re-calibration.

    ``jobs.recalibration.NightlyRecalibration``, above this module: it reads the runtime data.
    """

    def async_start(self) -> CALLBACK_TYPE:
        """Start watching for the night's window; return what stops it."""


@dataclass(slots=True)
class LLMLanesRuntimeData:
    """Everything one LLM server entry owns while it is loaded."""

    backend: Backend
    scheduler: Scheduler
    server: PollCoordinator
    """Polls the server's health, info and metrics."""
    activity: ActivityCoordinator
    """Scheduler snapshots pushed by the scheduler, at most once a second."""
    jobs: JobManager
    """Queues, throttles and runs the entry's nightly summarization jobs."""
    requesters: RequesterRegistry
    """The requesters the server charges under their own id (the rest are ``other``)."""
    calibration: Calibration
    """What ``run_benchmark`` measured and applied here, kept across restarts."""
    recalibration: Recalibration
    """Runs the re-calibration the stale-calibration repair plans, in the night's window."""
    data: dict[str, Any]
    """The entry's data the set-up was built from (URL, key, model); a change reloads."""
    subentries: dict[str, tuple[str, str, dict[str, Any]]]
    """Subentries the entities were built from (id -> type, title, data); a change reloads."""
    device_id: str = ""
    """Device registry id of the server's device (the agents' devices hang off it)."""
    sleeps: Callable[[], bool] = lambda: False
    """Whether the household's pool has the server asleep (or waking): its silence is no outage."""


type LLMLanesConfigEntry = ConfigEntry[LLMLanesRuntimeData]

WARM_UP_RETRY_INTERVAL: Final = timedelta(minutes=10)
"""After a warm-up that did not load the model, the next one waits this long."""
REFRESH_COOLDOWN_S = 1.0
"""The shortest time between two snapshots of one server."""
BUSY_REFRESH_INTERVAL = timedelta(seconds=2)
"""How often to take a snapshot while something is queued or in flight."""
IDLE_REFRESH_INTERVAL = timedelta(seconds=10)
"""How often to take a snapshot while the scheduler is idle."""
DOWN_POLL_INTERVAL: Final = timedelta(seconds=3)
"""How often a server that does not answer is polled: it shows as reachable this soon after."""


@dataclass(frozen=True, slots=True)
class PollResult:
    """What the server said at the last successful poll."""

    info: ServerInfo
    metrics: ServerMetrics
    model_loaded: bool
    """Whether the configured model is resident (or, where the server does not say, served)."""


class EntryCoordinator[DataT](DataUpdateCoordinator[DataT]):
    """A coordinator of one LLM server entry, named after its role and the entry."""

    config_entry: LLMLanesConfigEntry

    def __init__(
        self,
        hass: HomeAssistant,
        entry: LLMLanesConfigEntry,
        role: str,
        *,
        update_interval: timedelta | None,
    ) -> None:
        """Bind the coordinator to ``entry``; ``role`` names it in the logs."""
        super().__init__(
            hass,
            LOGGER,
            config_entry=entry,
            name=f"{DOMAIN} {role} {entry.title}",
            update_interval=update_interval,
        )


class PollCoordinator(EntryCoordinator[PollResult]):
    """Polls ``server_info`` and ``metrics``; entities go unavailable when a poll fails.

    It also keeps the configured model warm: at set-up, and whenever a poll finds it unloaded
    (the server restarted, or Ollama let it go), one warm-up runs in the background, so the first
    voice command of the day does not pay for a cold load.
    """

    def __init__(
        self, hass: HomeAssistant, entry: LLMLanesConfigEntry, backend: Backend
    ) -> None:
        """Poll ``backend`` for ``entry`` every ``SERVER_POLL_INTERVAL``."""
        super().__init__(hass, entry, "server", update_interval=SERVER_POLL_INTERVAL)
        self.backend = backend
        self.model: str = entry.data[CONF_MODEL]
        self.unreachable_since: datetime | None = None
        """When polls started failing (None while the server answers)."""
        self.warm_ups = 0
        """Warm-ups started since set-up."""
        self._warm_up_task: asyncio.Task[None] | None = None
        self._warm_up_not_before: datetime | None = None
        self._warm_up_failed_logged = False
        self._check_task: asyncio.Task[None] | None = None
        self._warm_up_at_setup = backend.profile.warm_up_at_setup

    @property
    def warming_up(self) -> bool:
        """Whether a warm-up is running now."""
        return self._warm_up_task is not None and not self._warm_up_task.done()

    @property
    def slots(self) -> int | None:
        """The server's slot count (sequences it runs at once), where it says."""
        return self.data.info.slots if self.data is not None else None

    @property
    def context_per_slot(self) -> int | None:
        """The tokens (prompt and answer) one request may hold at the server, where it says."""
        return self.data.info.context_length if self.data is not None else None

    @property
    def served_model(self) -> ServedModel | None:
        """What the last poll says the server runs the model as (None while it is down)."""
        if self.data is None or not self.last_update_success:
            return None
        info = self.data.info
        return ServedModel(
            model=self.model,
            variant=variant_of(info, self.model),
            context_per_slot=info.context_length,
        )

    @callback
    def async_request_finished(self, finished: FinishedRequest) -> None:
        """Learn from a request's outcome what the next poll would say (scheduler listener)."""
        if finished.outcome == "ok":
            if not self.last_update_success:
                self._async_poll_now()  # it answers again
        elif finished.error in SERVER_DOWN_ERRORS:
            newly_down = self.unreachable_since is None
            self._note_down(f"a request failed: {finished.error}")
            self.async_set_update_error(
                UpdateFailed(
                    translation_domain=DOMAIN,
                    translation_key="request_cannot_connect",
                )
            )
            if newly_down:
                # The coordinator plans its next poll as one ends: poll now, so that the next
                # comes ``DOWN_POLL_INTERVAL`` after, not what is left of the regular interval.
                self._async_poll_now()
        elif finished.error in SERVER_SUSPECT_ERRORS:
            self._async_poll_now()

    def _note_down(self, reason: str) -> None:
        """Note that the server does not answer: it is polled every ``DOWN_POLL_INTERVAL``.

        The interval applies from the end of the poll running (or the next one) on: the
        coordinator plans each poll as the one before ends. The log says it once, at WARNING,
        when a server that answered stops (a set-up that finds it down is Home Assistant's to
        say, a server the pool put to sleep is no outage), then at DEBUG: the reachable sensor
        and the repair say it meanwhile.
        """
        newly_down = self.unreachable_since is None
        if newly_down:
            self.unreachable_since = dt_util.utcnow()
        runtime = getattr(self.config_entry, "runtime_data", None)  # None during set-up
        asleep = runtime is not None and runtime.sleeps()
        log = (
            LOGGER.warning
            if newly_down and self.data is not None and not asleep
            else LOGGER.debug
        )
        log(
            "%s does not answer (%s); polling it every %s until it does",
            self.config_entry.title,
            reason,
            DOWN_POLL_INTERVAL,
        )
        self.update_interval = DOWN_POLL_INTERVAL

    def _note_up(self) -> None:
        """Note that the server answers: it is polled every ``SERVER_POLL_INTERVAL``."""
        self.update_interval = SERVER_POLL_INTERVAL
        if self.unreachable_since is not None:
            # Back after an outage (perhaps a restart that unloaded the model): try at once.
            self._warm_up_not_before = None
            self.unreachable_since = None

    @callback
    def _async_poll_now(self) -> None:
        """Poll now (once at a time), outside the regular schedule."""
        if self._check_task is None or self._check_task.done():
            self._check_task = self.config_entry.async_create_background_task(
                self.hass, self.async_refresh(), name=f"{DOMAIN} poll {self.name}"
            )

    async def _async_update_data(self) -> PollResult:
        """Ask the server what it is and how loaded it is."""
        try:
            info = await self.backend.server_info()
            metrics = await self._async_metrics()
        except AuthError as err:
            raise ConfigEntryAuthFailed(
                translation_domain=DOMAIN, translation_key="invalid_auth"
            ) from err
        except BackendError as err:
            self._note_down(str(err))
            # Said above: the coordinator would say it again, at ERROR.
            self.last_update_success = False
            raise UpdateFailed(
                translation_domain=DOMAIN,
                translation_key="update_failed",
                translation_placeholders={"error": str(err)},
            ) from err
        self._note_up()
        state = PollResult(
            info=info,
            metrics=metrics,
            model_loaded=model_is_loaded(self.model, info, metrics),
        )
        self._async_maybe_warm_up(state)
        return state

    async def _async_metrics(self) -> ServerMetrics:
        try:
            return await self.backend.metrics()
        except AuthError:
            raise
        except BackendError as err:
            # Metrics are optional (llama.cpp without --metrics): the server is still up.
            LOGGER.debug("Server metrics unavailable: %s", err)
            return ServerMetrics()

    async def async_ensure_model_loaded(self) -> None:
        """Load the model at once if the server has let it go (a command is coming).

        Only servers that unload models (Ollama, LM Studio) are asked; what they hold is read now,
        not from the last poll, and a failed warm-up's back-off does not apply.
        """
        if not self.backend.profile.unloads_models or self.warming_up:
            return
        if self.data is None or self.model not in self.data.info.models:
            return
        try:
            metrics = await self.backend.metrics()
        except BackendError as err:
            LOGGER.debug("Cannot tell whether %s is loaded: %s", self.model, err)
            return
        if self.model in metrics.loaded_models or self.warming_up:
            return
        self._async_start_warm_up(already_loaded=False)

    def _async_maybe_warm_up(self, state: PollResult) -> None:
        """Start one background warm-up when the model should be loaded and is not."""
        if self.warming_up or self.model not in state.info.models:
            return  # A model the server does not have is a repair issue, not a warm-up.
        at_setup = self._warm_up_at_setup
        self._warm_up_at_setup = False
        if not at_setup:
            if state.model_loaded or not self.backend.profile.unloads_models:
                # The others list every model they serve as loaded: a warm-up could never
                # change that, and would only be retried forever.
                return
            if (
                self._warm_up_not_before is not None
                and dt_util.utcnow() < self._warm_up_not_before
            ):
                return
        self._async_start_warm_up(already_loaded=state.model_loaded)

    def _async_start_warm_up(self, *, already_loaded: bool) -> None:
        self.warm_ups += 1
        self._warm_up_task = self.config_entry.async_create_background_task(
            self.hass,
            self._async_warm_up(already_loaded=already_loaded),
            name=f"{DOMAIN} warm-up {self.model}",
        )

    async def _async_warm_up(self, *, already_loaded: bool) -> None:
        """Load the model, then poll again so ``model_loaded`` and the sensors follow.

        Success is what the next poll reports, not what the warm-up call says: a server that
        takes the load request but still does not list the model is not asked again at once.
        """
        LOGGER.debug("Warming up %s on %s", self.model, self.backend.base_url)
        try:
            await self.backend.warm_up(self.model)
        except BackendError as err:
            self._async_warm_up_failed(str(err))
            await self.async_refresh()
            return
        await self.async_refresh()
        if not self.last_update_success:
            self._async_warm_up_failed("the server stopped answering")
        elif not self.data.model_loaded:
            self._async_warm_up_failed("the server does not report it as loaded")
        else:
            self._warm_up_not_before = None
            self._warm_up_failed_logged = False
            if not already_loaded:
                LOGGER.info("Loaded model %s on %s", self.model, self.backend.base_url)

    def _async_warm_up_failed(self, reason: str) -> None:
        """Wait before the next try; warn once until a warm-up works again."""
        self._warm_up_not_before = dt_util.utcnow() + WARM_UP_RETRY_INTERVAL
        if self._warm_up_failed_logged:
            LOGGER.debug("Warming up %s failed again: %s", self.model, reason)
            return
        self._warm_up_failed_logged = True
        LOGGER.warning(
            "Could not load model %s on %s (%s); trying again in %s",
            self.model,
            self.backend.base_url,
            reason,
            WARM_UP_RETRY_INTERVAL,
        )


class ActivityCoordinator(EntryCoordinator[SchedulerSnapshot]):
    """Holds the latest scheduler snapshot of one server, taken at most once a second.

    The first snapshot is the set-up's refresh; every later one is pushed
    (``async_set_updated_data``) by one debouncer, which a finished request and the timer call,
    when it differs from the last one in more than the time it was taken.
    """

    def __init__(
        self,
        hass: HomeAssistant,
        entry: LLMLanesConfigEntry,
        scheduler: Scheduler,
        *,
        is_attempt: Callable[[FinishedRequest], bool] = lambda _: False,
    ) -> None:
        """Follow ``scheduler``; nothing happens until ``async_setup``.

        ``is_attempt`` tells the attempts of the household pool's requests, which the pool
        reports itself (once per request, wherever it ended): their event is left out here.
        """
        super().__init__(hass, entry, "activity", update_interval=None)
        self.scheduler = scheduler
        self._is_attempt = is_attempt
        self._snapshots: Debouncer[None] = Debouncer(
            hass,
            LOGGER,
            cooldown=REFRESH_COOLDOWN_S,
            immediate=True,
            function=self._async_push_snapshot,
        )
        self._unsub_timer: CALLBACK_TYPE | None = None

    async def async_setup(self) -> None:
        """Take the first snapshot and start listening to finished requests."""
        self.config_entry.async_on_unload(
            self.scheduler.add_listener(self._async_request_finished)
        )
        await self.async_config_entry_first_refresh()

    async def _async_update_data(self) -> SchedulerSnapshot:
        """Take a snapshot (cheap, in memory)."""
        return self._take_snapshot()

    async def async_shutdown(self) -> None:
        """Stop the timer and the debouncer with the coordinator."""
        self._cancel_timer()
        self._snapshots.async_shutdown()
        await super().async_shutdown()

    @callback
    def _async_push_snapshot(self) -> None:
        """Push a new snapshot, unless it says what the last one said (an idle server's timer).

        Nothing is written then: no entity state, and no "Manually updated" debug line every
        idle refresh.
        """
        snapshot = self._take_snapshot()
        if self.data is not None and replace(snapshot, taken_at=self.data.taken_at) == (
            self.data
        ):
            return
        self.async_set_updated_data(snapshot)

    @callback
    def _take_snapshot(self) -> SchedulerSnapshot:
        """Take a snapshot and plan the next timed one."""
        snapshot = self.scheduler.snapshot()
        self._schedule_timer(
            BUSY_REFRESH_INTERVAL
            if snapshot.queue_depth or snapshot.in_flight
            else IDLE_REFRESH_INTERVAL
        )
        return snapshot

    @callback
    def _async_request_finished(self, finished: FinishedRequest) -> None:
        """Fire the event for one finished request and ask for a fresh snapshot."""
        if not self._is_attempt(finished):
            self.hass.bus.async_fire(
                EVENT_REQUEST_FINISHED,
                request_finished_event_data(self.config_entry.entry_id, finished),
            )
        self._snapshots.async_schedule_call()

    @callback
    def _schedule_timer(self, delay: timedelta) -> None:
        self._cancel_timer()
        self._unsub_timer = async_call_later(self.hass, delay, self._async_timer_fired)

    @callback
    def _async_timer_fired(self, _now: Any) -> None:
        self._unsub_timer = None
        self._snapshots.async_schedule_call()

    @callback
    def _cancel_timer(self) -> None:
        if self._unsub_timer is not None:
            self._unsub_timer()
            self._unsub_timer = None
