"""The household's servers as one pool: every loaded LLM Lanes server is a member.

One ``Household`` per Home Assistant (``household_of(hass)``, in ``hass.data``) holds:

- the quota ledger every server's scheduler is built with: a requester's daily quota counts
  the tokens of every server (each server checks its own quota settings against it);
- the ``ServerPool`` of the loaded server entries (``core/pool.py``): an entry joins once it is
  set up and leaves when it unloads; its options (section ``pool``, ``settings_options
  .pool_options``) say per lane whether and in which order it serves it, and which entities wake
  it and put it to sleep; a change of those options, or of the models and context its polls
  report, updates its membership at once. Nothing of an entry stays once it has left;
- what the pool tells Home Assistant: one ``llm_lanes_request_finished`` per pool request (the
  member schedulers leave those attempts out of their own events, ``is_attempt``), the states
  and counters the pool's sensors show (``add_listener``), and the repair raised while every
  server of a lane is down.

Only what targets the pool goes through it: agents, AI Task entities and clients set to the pool,
the actions called with ``pool``, and the jobs of a server that can be woken (so that they wake
it). Everything else goes to its own server's scheduler, as with one server.

What is seen of a server from outside reaches the pool here (``report``): a poll that answered
puts it up; one that failed puts it down, or asleep when it has a wake entity (a sleeping desktop
does not answer). Waking and sleeping are entity actions (``PowerControl``): a ``button`` is
pressed; a ``switch`` is turned on to wake and off to sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Final, Unpack

from homeassistant.components.button.const import SERVICE_PRESS
from homeassistant.const import ATTR_ENTITY_ID, SERVICE_TURN_OFF, SERVICE_TURN_ON
from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback, split_entity_id
from homeassistant.helpers.debounce import Debouncer
from homeassistant.helpers.event import async_track_time_interval
from homeassistant.util import dt as dt_util
from homeassistant.util.hass_dict import HassKey

from custom_components.llm_lanes.const import (
    CONF_MODEL,
    DOMAIN,
    EVENT_REQUEST_FINISHED,
    LOGGER,
)
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.availability import (
    Action,
    PowerControl,
    ServerState,
    answers,
)
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk
from custom_components.llm_lanes.core.pool import ServerPool
from custom_components.llm_lanes.core.pool_journey import PoolSubmission
from custom_components.llm_lanes.core.pool_members import PoolMember, PoolSettings
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.router import ANY_MODEL, Capabilities
from custom_components.llm_lanes.core.snapshot import FinishedRequest, PoolSnapshot
from custom_components.llm_lanes.jobs.model import Job
from custom_components.llm_lanes.jobs.run import SchedulerRoute
from custom_components.llm_lanes.listeners import Listeners
from custom_components.llm_lanes.repairs import (
    async_clear_pool_lane_issue,
    async_raise_pool_lane_issue,
)
from custom_components.llm_lanes.request_events import request_finished_event_data
from custom_components.llm_lanes.settings_options import (
    PoolOptions,
    pool_options,
    pool_routes,
)

HOUSEHOLD: Final[HassKey[Household]] = HassKey(DOMAIN)
TICK_INTERVAL: Final = timedelta(seconds=5)
"""How often the pool's states are looked at (sensors, the lane repair) while it has members."""
NOTIFY_COOLDOWN_S: Final = 1.0
"""The shortest time between two updates of the pool's entities."""
LANE_DOWN_REPAIR_AFTER: Final = timedelta(minutes=1)
"""How long every server of a lane may be down before the repair is raised."""


def household_of(hass: HomeAssistant) -> Household:
    """Return the household of this Home Assistant (made the first time it is asked for)."""
    found = hass.data.get(HOUSEHOLD)
    if found is None:
        found = hass.data[HOUSEHOLD] = Household(hass)
    return found


def entity_action(hass: HomeAssistant, entity_id: str, *, wake: bool) -> Action:
    """Return the action that presses a button, or turns a switch on (wake) or off (sleep)."""
    domain = split_entity_id(entity_id)[0]
    if domain == "button":
        service = SERVICE_PRESS
    else:
        service = SERVICE_TURN_ON if wake else SERVICE_TURN_OFF

    async def act() -> None:
        LOGGER.info("%s %s", service, entity_id)
        await hass.services.async_call(
            domain, service, {ATTR_ENTITY_ID: entity_id}, blocking=True
        )

    return act


class Household:
    """The household's servers, their pool and what it reports (see the module docstring)."""

    def __init__(self, hass: HomeAssistant) -> None:
        """Start with no member; entries join as they are set up."""
        self.hass = hass
        self.quotas = QuotaLedger()
        """Tokens per requester over the last 24 hours, on every server."""
        self.pool = ServerPool([], PoolSettings(), quotas=self.quotas)
        self._entries: dict[str, LLMLanesConfigEntry] = {}
        self._options: dict[str, PoolOptions] = {}
        self._update_lock = asyncio.Lock()
        self._listeners = Listeners()
        self._unsub_tick: CALLBACK_TYPE | None = None
        self._down_since: dict[Lane, datetime] = {}
        self._notify = Debouncer(
            hass,
            LOGGER,
            cooldown=NOTIFY_COOLDOWN_S,
            immediate=True,
            function=self._async_notify,
        )
        self.pool.add_listener(self._request_finished)

    # --- membership -----------------------------------------------------------------------------

    @property
    def members(self) -> list[LLMLanesConfigEntry]:
        """The member entries, in the order they were added to Home Assistant."""
        return [
            entry
            for entry in self.hass.config_entries.async_entries(DOMAIN)
            if entry.entry_id in self._entries
        ]

    def is_member(self, entry_id: str) -> bool:
        """Whether the entry's server is in the pool."""
        return entry_id in self._entries

    async def async_join(self, entry: LLMLanesConfigEntry) -> None:
        """Add a server that was set up (or take what changed of one already in)."""
        self._entries[entry.entry_id] = entry
        await self.async_update()
        if self._unsub_tick is None:
            self._unsub_tick = async_track_time_interval(
                self.hass, self._tick, TICK_INTERVAL, name=f"{DOMAIN} pool"
            )

    async def async_leave(self, entry: LLMLanesConfigEntry) -> None:
        """Take out a server that unloads; with the last one, stop looking at the pool."""
        if self._entries.pop(entry.entry_id, None) is None:
            return
        self._options.pop(entry.entry_id, None)
        await self.async_update()
        if not self._entries and self._unsub_tick is not None:
            self._unsub_tick()
            self._unsub_tick = None
            self._notify.async_cancel()
        self._check_lanes(dt_util.utcnow())

    async def async_update(self) -> None:
        """Bring the pool's members and routes to what the loaded entries say now."""
        async with self._update_lock:
            entries = self.members
            self._options = {
                entry.entry_id: pool_options(entry.options) for entry in entries
            }
            routes = pool_routes(
                [(entry.entry_id, self._options[entry.entry_id]) for entry in entries]
            )
            await self.pool.update(
                [self._member(entry) for entry in entries],
                replace(self.pool.settings, routes=routes),
            )
        self._async_notify()  # at once: a new member's entities may come with it

    @callback
    def async_schedule_update(self) -> None:
        """Update the pool soon (from a callback: options applied, a poll's news)."""
        self.hass.async_create_background_task(
            self.async_update(), f"{DOMAIN} pool update", eager_start=False
        )

    def _member(self, entry: LLMLanesConfigEntry) -> PoolMember:
        runtime = entry.runtime_data
        server = runtime.server
        options = self._options[entry.entry_id]
        models = server.data.info.models if server.data is not None else ()
        power = PowerControl(
            wake=entity_action(self.hass, options.wake_entity, wake=True)
            if options.wake_entity
            else None,
            sleep=entity_action(self.hass, options.sleep_entity, wake=False)
            if options.sleep_entity
            else None,
            wake_limit_s=options.wake_limit_s,
            idle_sleep_s=options.idle_sleep_s,
        )
        if server.last_update_success:
            state = ServerState.UP
        else:
            state = ServerState.ASLEEP if power.wake else ServerState.DOWN
        return PoolMember(
            name=entry.entry_id,
            scheduler=runtime.scheduler,
            health=answers(runtime.backend),
            capabilities=Capabilities(
                model=entry.data[CONF_MODEL],
                models=models,
                context_tokens=server.context_per_slot,
            ),
            power=power,
            state=state,
        )

    # --- what is seen of a server -----------------------------------------------------------------

    def report(self, entry_id: str, *, answers: bool, waiting: int | None) -> None:
        """Take a poll of a member: it answered (with ``waiting`` requests inside it) or not."""
        if entry_id not in self._entries:
            return
        state = self.pool.state(entry_id)
        if answers:
            self.pool.report(entry_id, ServerState.UP)
            self.pool.report_queue(entry_id, waiting or 0)
        elif state in (ServerState.UP, ServerState.DOWN):
            self.pool.report(
                entry_id,
                ServerState.ASLEEP if self.can_wake(entry_id) else ServerState.DOWN,
            )
        if self.pool.state(entry_id) is not state:
            self._notify_soon()

    def state(self, entry_id: str) -> ServerState | None:
        """Return a member's state (None: the entry is not in the pool)."""
        return self.pool.state(entry_id) if entry_id in self._entries else None

    def can_wake(self, entry_id: str) -> bool:
        """Whether the member has a wake entity."""
        options = self._options.get(entry_id)
        return options is not None and options.wake_entity is not None

    def title(self, entry_id: str | None) -> str | None:
        """Return a member's title (None for none)."""
        entry = self._entries.get(entry_id) if entry_id is not None else None
        return entry.title if entry is not None else None

    def can_serve(self, lane: Lane) -> bool:
        """Whether a server of the lane's route is up, waking, or (not for voice) can be woken."""
        for name in self.pool.route(lane):
            state = self.pool.state(name)
            if state in (ServerState.UP, ServerState.WAKING):
                return True
            if not lane.urgent and self.can_wake(name):
                return True
        return False

    def snapshot(self) -> PoolSnapshot:
        """Return the pool's state now."""
        return self.pool.snapshot()

    # --- requests -------------------------------------------------------------------------------

    def stream(
        self, request: ChatRequest, **how: Unpack[PoolSubmission]
    ) -> AsyncGenerator[StreamChunk]:
        """Send a request to the pool (``server``: one member only, woken if need be)."""
        return self.pool.stream(request, **how)

    def is_attempt(self, record: FinishedRequest) -> bool:
        """Whether a member scheduler's record is an attempt of a pool request."""
        return self.pool.is_attempt(record)

    async def async_prepare(self) -> None:
        """Make room for a voice command coming to the pool; wake the boxes voice prefers.

        The server voice goes to now reloads its model if it let it go.
        """
        self.pool.prepare(Lane.VOICE)
        preferred = self.pool.snapshot().preferred.get(Lane.VOICE)
        entry = self._entries.get(preferred) if preferred is not None else None
        if entry is not None:
            await entry.runtime_data.server.async_ensure_model_loaded()

    def job_route(self, entry: LLMLanesConfigEntry) -> EntryJobRoute:
        """Return where the jobs of ``entry`` go."""
        return EntryJobRoute(self, entry)

    @callback
    def _request_finished(self, record: FinishedRequest) -> None:
        """Report a pool request once, under the server it ended on."""
        self.hass.bus.async_fire(
            EVENT_REQUEST_FINISHED,
            request_finished_event_data(record.server, record, pool=True),
        )
        self._notify_soon()

    # --- the entities and the repair ------------------------------------------------------------

    @callback
    def add_listener(self, listener: CALLBACK_TYPE) -> CALLBACK_TYPE:
        """Call ``listener`` (at most once a second) when the pool's states or counters change."""
        return self._listeners.add(listener)

    @callback
    def _notify_soon(self) -> None:
        if self._entries:
            self._notify.async_schedule_call()

    @callback
    def _async_notify(self) -> None:
        self._listeners.changed()

    @callback
    def _tick(self, now: datetime) -> None:
        self._check_lanes(now)
        self._notify_soon()

    @callback
    def _check_lanes(self, now: datetime) -> None:
        """Raise the repair of a lane whose every server has been down a while; clear it after.

        Only for a pool of two servers or more: one server's outage has its own repair. A lane
        is down while no server of it is up or waking and none can be woken for it (voice never
        waits for a wake).
        """
        for lane in LANES:
            route = self.pool.route(lane) if len(self._entries) > 1 else ()
            down = bool(route) and not self.can_serve(lane)
            if not down:
                if self._down_since.pop(lane, None) is not None:
                    async_clear_pool_lane_issue(self.hass, lane)
                continue
            since = self._down_since.setdefault(lane, now)
            if now - since >= LANE_DOWN_REPAIR_AFTER:
                async_raise_pool_lane_issue(
                    self.hass,
                    lane,
                    [self.title(name) or name for name in route],
                )


class EntryJobRoute:
    """Where the jobs of one server go: the pool for a job of the pool, or one that may wake it.

    A job of a server without a wake entity goes to its scheduler, as with one server.
    """

    def __init__(self, home: Household, entry: LLMLanesConfigEntry) -> None:
        """Route the jobs of ``entry``."""
        self._home = home
        self._entry = entry

    def _own(self) -> SchedulerRoute:
        runtime = self._entry.runtime_data
        return SchedulerRoute(
            runtime.scheduler, lambda: runtime.server.last_update_success
        )

    def reachable(self, job: Job) -> bool:
        """Whether the job can run now: a server for it answers, or can be woken."""
        entry_id = self._entry.entry_id
        if job.pool and self._home.is_member(entry_id):
            return self._home.can_serve(Lane.BACKGROUND)
        if self._home.can_wake(entry_id):
            return True
        return self._own().reachable(job)

    def stream(self, job: Job, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Send the job's request where it runs."""
        entry_id = self._entry.entry_id
        pooled = job.pool and self._home.is_member(entry_id)
        if not pooled and not self._home.can_wake(entry_id):
            return self._own().stream(job, request)
        return self._home.stream(
            replace(request, model=ANY_MODEL) if pooled else request,
            lane=Lane.BACKGROUND,
            requester=job.requester,
            prompt_tokens=job.prompt_tokens_estimate,
            server=None if pooled else entry_id,
        )
