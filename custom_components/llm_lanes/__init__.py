"""LLM Lanes: a priority scheduler in front of a household's local LLM server."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_API_KEY, CONF_URL, Platform
from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.exceptions import ConfigEntryNotReady
from homeassistant.helpers import config_validation as cv, device_registry as dr
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.dispatcher import async_dispatcher_send
from homeassistant.helpers.typing import ConfigType

from custom_components.llm_lanes.backend_setup import build_backend
from custom_components.llm_lanes.calibration import async_track_calibration
from custom_components.llm_lanes.calibration_record import Calibration
from custom_components.llm_lanes.const import (
    CONF_KIND,
    CONF_MODEL,
    DOMAIN,
    LOGGER,
    SUBENTRY_CLIENT,
)
from custom_components.llm_lanes.coordinator import (
    ActivityCoordinator,
    LLMLanesConfigEntry,
    LLMLanesRuntimeData,
    PollCoordinator,
)
from custom_components.llm_lanes.core.availability import ServerState
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.curve_view import CurvePlotView
from custom_components.llm_lanes.dashboard import async_setup_dashboard
from custom_components.llm_lanes.entity import (
    options_applied_signal,
    server_device_info,
)
from custom_components.llm_lanes.entry_defaults import (
    NAMED_SUBENTRY_TYPES,
    legacy_subentry_titles,
)
from custom_components.llm_lanes.gateway import async_register_gateway
from custom_components.llm_lanes.gateway.clients import client_quotas
from custom_components.llm_lanes.household import household_of
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.jobs.recalibration import NightlyRecalibration
from custom_components.llm_lanes.jobs.store import JobStore
from custom_components.llm_lanes.repairs import async_track_server_issues
from custom_components.llm_lanes.requesters import (
    RequesterRegistry,
    async_remove_deleted_client_sensors,
    requesters_with_sensors,
)
from custom_components.llm_lanes.services import async_setup_services
from custom_components.llm_lanes.settings_options import (
    job_settings_from_options,
    pool_options,
    settings_from_options,
)

PLATFORMS: list[Platform] = [
    Platform.AI_TASK,
    Platform.BINARY_SENSOR,
    Platform.CONVERSATION,
    Platform.NUMBER,
    Platform.SELECT,
    Platform.SENSOR,
    Platform.SWITCH,
]

CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Register the actions, the dashboard and the endpoints (once, whatever the servers)."""
    async_setup_services(hass)
    await async_setup_dashboard(hass)
    async_register_gateway(hass)
    hass.http.register_view(CurvePlotView())
    return True


async def async_migrate_entry(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> bool:
    """Bring an entry made by an older version up to date (a newer one is refused).

    1.1 → 1.2: agents and AI Task entities that still have their default titles ("llama.cpp on
    nas conversation") are named after their server alone; their entities say what they are.
    """
    if entry.version > 1:
        return False
    if entry.minor_version < 2:
        kind = ServerKind(entry.data[CONF_KIND])
        for subentry in entry.subentries.values():
            if subentry.subentry_type not in NAMED_SUBENTRY_TYPES:
                continue
            legacy = legacy_subentry_titles(
                subentry.subentry_type, kind, entry.data[CONF_URL]
            )
            if subentry.title in legacy:
                hass.config_entries.async_update_subentry(
                    entry, subentry, title=legacy[subentry.title]
                )
        hass.config_entries.async_update_entry(entry, minor_version=2)
    return True


async def async_setup_entry(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> bool:
    """Set up one LLM server: backend client, server coordinator, scheduler, entities."""
    backend = build_backend(
        async_get_clientsession(hass),
        ServerKind(entry.data[CONF_KIND]),
        entry.data[CONF_URL],
        entry.data.get(CONF_API_KEY),
    )
    server = PollCoordinator(hass, entry, backend)
    try:
        await server.async_config_entry_first_refresh()
    except ConfigEntryNotReady:
        if pool_options(entry.options).wake_entity is None:
            raise
        # A machine that sleeps until its wake entity starts it: set up asleep, woken for work.
        LOGGER.info("%s does not answer: set up asleep", entry.title)

    home = household_of(hass)
    scheduler = Scheduler(
        backend, scheduler_settings(entry, server), quotas=home.quotas
    )
    activity = ActivityCoordinator(hass, entry, scheduler, is_attempt=home.is_attempt)
    jobs = JobManager(
        hass,
        entry.entry_id,
        scheduler,
        model=entry.data[CONF_MODEL],
        settings=job_settings_from_options(entry.options),
        route=home.job_route(entry),
    )
    async_remove_deleted_client_sensors(hass, entry.entry_id, entry.subentries)
    requesters = RequesterRegistry(requesters_with_sensors(hass, entry.entry_id))
    requesters.allow(scheduler.settings.requester_quotas)  # the options name them
    calibration = Calibration(hass, entry.entry_id)
    await calibration.async_load()
    entry.runtime_data = LLMLanesRuntimeData(
        backend=backend,
        scheduler=scheduler,
        server=server,
        activity=activity,
        jobs=jobs,
        requesters=requesters,
        calibration=calibration,
        recalibration=NightlyRecalibration(hass, entry),
        data=dict(entry.data),
        subentries=subentry_signature(entry),
        sleeps=lambda: (
            home.state(entry.entry_id) in (ServerState.ASLEEP, ServerState.WAKING)
        ),
    )
    entry.async_on_unload(scheduler.close)
    entry.async_on_unload(scheduler.add_listener(server.async_request_finished))
    entry.async_on_unload(server.async_add_listener(_server_listener(hass, entry)))
    await activity.async_setup()
    await jobs.async_start()
    # Unload callbacks run last-in first-out: running jobs stop (and are kept as interrupted)
    # before the scheduler closes under them.
    entry.async_on_unload(jobs.async_stop)

    entry.async_on_unload(entry.add_update_listener(_async_entry_updated))
    # The server's device first, so the agents' devices can hang off it (via_device).
    entry.runtime_data.device_id = (
        dr.async_get(hass)
        .async_get_or_create(
            config_entry_id=entry.entry_id, **server_device_info(entry)
        )
        .id
    )
    async_track_server_issues(hass, entry)
    async_track_calibration(hass, entry)
    entry.async_on_unload(entry.runtime_data.recalibration.async_start())
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    # Last: the household's pool sends work to the server only once it is all set up, and it
    # leaves the pool before anything of it is taken down (unload callbacks run last first).
    await home.async_join(entry)
    entry.async_on_unload(lambda: home.async_leave(entry))
    jobs.reachability_changed()  # a server that can be woken takes its jobs now
    return True


async def _async_entry_updated(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> None:
    """Follow changes of the entry: options apply at once, other changes reload it.

    The data (URL, key, model: a reconfigure, a reauth, the model repair) and the subentries
    (agents, AI Task entities) are what the set-up was built from, so a change of either reloads
    the entry. The flows only store these changes: Home Assistant wants an entry with an update
    listener to reload from it. Gateway clients are not among those subentries: they need no
    entities (their keys are looked up per request, their quotas are scheduler settings); a
    deleted client's token sensor is removed.

    A flow may store several such changes in one step (a reconfigure renames the agents, then
    stores the data), and this listener runs at each. The reload waits for the end of the step
    (its task starts on the next turn of the loop), so that its set-up reads every change, and
    runs once: the first of these tasks replaces the set-up the others were started for.
    """
    async_remove_deleted_client_sensors(hass, entry.entry_id, entry.subentries)
    runtime = entry.runtime_data
    if (
        dict(entry.data) != runtime.data
        or subentry_signature(entry) != runtime.subentries
    ):
        entry.async_create_task(
            hass,
            _async_reload(hass, entry, runtime),
            f"{DOMAIN} reload {entry.title}",
            eager_start=False,
        )
        return
    async_apply_options(hass, entry)


async def _async_reload(
    hass: HomeAssistant, entry: LLMLanesConfigEntry, runtime: LLMLanesRuntimeData
) -> None:
    """Reload the entry, unless it no longer runs the set-up ``runtime`` (a reload came first)."""
    if entry.state is ConfigEntryState.LOADED and entry.runtime_data is runtime:
        hass.config_entries.async_schedule_reload(entry.entry_id)


@callback
def async_apply_options(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> None:
    """Apply the entry's options to the running scheduler and jobs, without a reload.

    Then the setting controls (numbers, select, switch) are told, so they show what the
    scheduler now runs with, whoever changed the options.
    """
    runtime = entry.runtime_data
    runtime.scheduler.update_settings(scheduler_settings(entry, runtime.server))
    runtime.requesters.allow(runtime.scheduler.settings.requester_quotas)
    runtime.jobs.update_settings(
        job_settings_from_options(entry.options, runtime.jobs.settings)
    )
    home = household_of(hass)
    if home.is_member(entry.entry_id):
        home.async_schedule_update()  # its lanes' ranks, wake and sleep entities
        runtime.jobs.reachability_changed()
    async_dispatcher_send(hass, options_applied_signal(entry.entry_id))


def scheduler_settings(
    entry: LLMLanesConfigEntry, server: PollCoordinator
) -> SchedulerSettings:
    """Build the scheduler settings of the entry's options, bounded by what the server last said.

    The daily quotas the gateway clients set join the options' own.
    """
    settings = settings_from_options(
        entry.options, server.slots, server.context_per_slot
    )
    quotas = {**settings.requester_quotas, **client_quotas(entry)}
    return replace(settings, requester_quotas=quotas)


def _server_listener(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> CALLBACK_TYPE:
    """Follow the server's polls: its slots and context bound the settings, jobs need it up.

    The household's pool hears of each poll too, and of what the server now serves.
    """
    server = entry.runtime_data.server
    limits = (server.slots, server.context_per_slot)
    reachable = server.last_update_success
    models = server.data.info.models if server.data is not None else ()

    @callback
    def polled() -> None:
        nonlocal limits, reachable, models
        runtime = entry.runtime_data
        home = household_of(hass)
        home.report(
            entry.entry_id,
            answers=server.last_update_success,
            waiting=server.data.metrics.requests_waiting
            if server.data is not None
            else None,
        )
        pool_news = False
        if (server.slots, server.context_per_slot) != limits:
            limits = (server.slots, server.context_per_slot)
            runtime.scheduler.update_settings(scheduler_settings(entry, server))
            pool_news = True
        if server.data is not None and server.data.info.models != models:
            models = server.data.info.models
            pool_news = True
        if pool_news and home.is_member(entry.entry_id):
            home.async_schedule_update()  # what the server can serve changed
        if server.last_update_success != reachable:
            reachable = server.last_update_success
            runtime.jobs.reachability_changed()

    return polled


def subentry_signature(
    entry: LLMLanesConfigEntry,
) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Describe what the subentry entities depend on: their type, title and data.

    Gateway clients have no entities of their own and are left out.
    """
    return {
        subentry_id: (subentry.subentry_type, subentry.title, dict(subentry.data))
        for subentry_id, subentry in entry.subentries.items()
        if subentry.subentry_type != SUBENTRY_CLIENT
    }


async def async_unload_entry(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> bool:
    """Unload the platforms; the scheduler closes with the entry (every caller is cancelled)."""
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)


async def async_remove_entry(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> None:
    """Forget the entry's stored jobs and calibration when the server is deleted."""
    await JobStore(hass, entry.entry_id).async_remove()
    await Calibration(hass, entry.entry_id).async_remove()
