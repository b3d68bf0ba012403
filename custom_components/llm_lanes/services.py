"""The actions of LLM Lanes: ``generate``, ``run_benchmark``, ``summarize``, ``cancel_job``, ``list_jobs``.

Each action names its server by ``config_entry_id`` (optional where the only loaded server will
do), and every one resolves it the same way (``_loaded_entries``). ``generate`` and
``summarize`` with ``pool`` run on the household's pool instead: the server named is where the
call's limits, requester and job are kept, and the pool routes the request over every loaded
server that serves its lane (each runs it as its own model, unless the call names one). Engine errors become translated
Home Assistant errors through ``translated_errors``; every other error an action raises is
translated too (``validation_error``).

Every field is bounded (``service_schemas``) and every check runs before anything is stored or
sent: a prompt that cannot fit its lane or the server's context is refused with the numbers.

Who may do what: a call without a user (an automation, a script it runs, Home Assistant itself)
or by an admin may do everything. A non-admin user is always charged as themself (a ``requester``
they give is ignored: the response says who was charged), sees and cancels only their own jobs,
and may not ``apply`` a benchmark's settings or ``force`` one outside the quiet hours
(``authorization``: the settings are an admin's, as the options).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from homeassistant.auth.models import User
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import ATTR_CONFIG_ENTRY_ID
from homeassistant.core import (
    HomeAssistant,
    ServiceCall,
    ServiceResponse,
    SupportsResponse,
    callback,
)
from homeassistant.util import dt as dt_util
import probatio

from custom_components.llm_lanes.authorization import (
    async_caller,
    async_require_admin,
    is_restricted,
)
from custom_components.llm_lanes.calibration import async_calibrate
from custom_components.llm_lanes.const import CONF_MODEL, DOMAIN
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.bench.calibrate import (
    MAX_DURATION_S,
    MIN_FINISHED_PER_ROW,
    measured_requests,
    shortest_duration,
)
from custom_components.llm_lanes.core.bench.workload import load_scenario
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.router import ANY_MODEL
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens
from custom_components.llm_lanes.error_translation import (
    refuse_unless_fits,
    translated_errors,
    validation_error,
)
from custom_components.llm_lanes.household import household_of
from custom_components.llm_lanes.jobs.delivery import notify_target_exists
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.jobs.model import Job, JobSpec, JobStatus
from custom_components.llm_lanes.jobs.prompts import (
    JobPrompt,
    async_history_prompt,
    text_prompt,
)
from custom_components.llm_lanes.requesters import (
    JOBS_REQUESTER,
    job_requester,
    requester_for_context,
    user_requester,
)
from custom_components.llm_lanes.service_schemas import (
    ATTR_APPLY,
    ATTR_DURATION_S,
    ATTR_ENTITY_IDS,
    ATTR_FORCE,
    ATTR_INSTRUCTIONS,
    ATTR_JOB_ID,
    ATTR_LANE,
    ATTR_LOOK_BACK,
    ATTR_MAX_OUTPUT_TOKENS,
    ATTR_MAX_TOKENS,
    ATTR_MODEL,
    ATTR_NAME,
    ATTR_NOTIFY_TARGET,
    ATTR_PERSISTENT_NOTIFICATION,
    ATTR_POOL,
    ATTR_PROMPT,
    ATTR_REQUESTER,
    ATTR_RUN_NOW,
    ATTR_SCENARIO,
    ATTR_STATUS,
    ATTR_TEXT,
    ATTR_WAIT,
    CANCEL_JOB_SCHEMA,
    GENERATE_SCHEMA,
    LIST_JOBS_SCHEMA,
    RUN_BENCHMARK_SCHEMA,
    SUMMARIZE_SCHEMA,
)

SERVICE_GENERATE = "generate"
SERVICE_RUN_BENCHMARK = "run_benchmark"
SERVICE_SUMMARIZE = "summarize"
SERVICE_CANCEL_JOB = "cancel_job"
SERVICE_LIST_JOBS = "list_jobs"

GENERATE_DEFAULT_REQUESTER = "generate"
WAIT_TIMEOUT_S = 900.0
"""The longest ``summarize`` with ``wait`` holds the caller; the job goes on afterwards."""

# --- which server, and who asks ------------------------------------------------------------------


def _loaded_entries(
    hass: HomeAssistant, entry_id: str | None
) -> list[LLMLanesConfigEntry]:
    """Return the loaded entry ``entry_id`` names, or every loaded entry when it names none."""
    if entry_id is None:
        return hass.config_entries.async_loaded_entries(DOMAIN)
    entry: LLMLanesConfigEntry | None = hass.config_entries.async_get_entry(entry_id)
    if (
        entry is None
        or entry.domain != DOMAIN
        or entry.state is not ConfigEntryState.LOADED
    ):
        raise validation_error("entry_not_loaded", entry_id=entry_id)
    return [entry]


def _entry(call: ServiceCall) -> LLMLanesConfigEntry:
    """Return the server the call names, or the only loaded one."""
    entries = _loaded_entries(call.hass, call.data.get(ATTR_CONFIG_ENTRY_ID))
    if not entries:
        raise validation_error("no_server_loaded")
    if len(entries) > 1:
        raise validation_error("several_servers")
    return entries[0]


def _job_managers(call: ServiceCall) -> list[JobManager]:
    """Return the job manager of the server the call names, or of every loaded server."""
    return [
        entry.runtime_data.jobs
        for entry in _loaded_entries(call.hass, call.data.get(ATTR_CONFIG_ENTRY_ID))
    ]


async def _async_user(call: ServiceCall) -> User | None:
    """Return the user who made the call (None: an automation, a script, Home Assistant)."""
    return await async_caller(call.hass, call.context)


def _may_see(user: User | None, job: Job) -> bool:
    """Whether the caller may list and cancel ``job``."""
    return not is_restricted(user) or (user is not None and job.user_id == user.id)


async def _async_requester(
    call: ServiceCall,
    entry: LLMLanesConfigEntry,
    user: User | None,
    *,
    named: str | None,
    default: str,
) -> str:
    """Who the call is charged to.

    A non-admin user always; else the requester the call gives, else ``named`` (a named job),
    else the user or automation that called, else ``default``. A given or named requester is
    kept only if the server keeps it (``RequesterRegistry``), else it is ``other``.
    """
    if user is not None and is_restricted(user):
        return user_requester(user.id)
    asked: str | None = call.data.get(ATTR_REQUESTER) or named
    if asked is not None:
        return await entry.runtime_data.requesters.async_charge_as(call.hass, asked)
    return requester_for_context(call.hass, call.context, default)


# --- generate and run_benchmark -----------------------------------------------------------------


def _refuse_unless_fits(
    entry: LLMLanesConfigEntry,
    lane: Lane,
    prompt_tokens: int,
    output_tokens: int,
    *,
    pool: bool = False,
) -> None:
    """Refuse, with the numbers, a request its lane or the server's context cannot take.

    An answer longer than the lane allows is named first (the caller's own number), then a
    request the server's context cannot hold, then a prompt over the lane's limit. For the
    ``pool``, each server's context is the pool's to weigh (it passes over those too small).
    """
    limits = entry.runtime_data.scheduler.settings.lanes[lane]
    breach = limits.refusal(
        lane, prompt_tokens=prompt_tokens, output_tokens=output_tokens
    )
    if breach is not None and breach.limit == "max_output_tokens":
        # Named as the caller named it (the action's field is max_tokens).
        named = breach.naming(ATTR_MAX_TOKENS)
        raise validation_error(named.translation_key, **named.placeholders)
    refuse_unless_fits(
        "context_exceeded",
        prompt_tokens,
        output_tokens,
        None if pool else entry.runtime_data.server.context_per_slot,
    )
    if breach is not None:
        raise validation_error(breach.translation_key, **breach.placeholders)


async def async_generate(call: ServiceCall) -> ServiceResponse:
    """Send one prompt through the chosen server's scheduler and return the answer."""
    entry = _entry(call)
    user = await _async_user(call)
    messages: list[ChatMessage] = []
    if instructions := call.data.get(ATTR_INSTRUCTIONS):
        messages.append(ChatMessage(role="system", content=instructions))
    messages.append(ChatMessage(role="user", content=call.data[ATTR_PROMPT]))
    pool = call.data[ATTR_POOL]
    request = ChatRequest(
        model=call.data.get(ATTR_MODEL)
        or (ANY_MODEL if pool else entry.data[CONF_MODEL]),
        messages=tuple(messages),
        max_tokens=call.data.get(ATTR_MAX_TOKENS),
    )
    lane = Lane.from_key(call.data[ATTR_LANE])
    scheduler = entry.runtime_data.scheduler
    _refuse_unless_fits(
        entry,
        lane,
        estimate_prompt_tokens(request),
        request.max_tokens or scheduler.settings.lanes[lane].default_output_tokens,
        pool=pool,
    )
    requester = await _async_requester(
        call, entry, user, named=None, default=GENERATE_DEFAULT_REQUESTER
    )
    with translated_errors():
        if pool:
            result = await household_of(call.hass).pool.generate(
                request, lane=lane, requester=requester
            )
        else:
            result = await scheduler.generate(request, lane=lane, requester=requester)
    finished = result.finished
    return {
        "text": result.text,
        "server": finished.server or entry.entry_id,
        "failovers": finished.failovers,
        "finish_reason": result.finish_reason,
        "lane": finished.lane.key,
        "requester": finished.requester,
        "prompt_tokens": result.usage.prompt_tokens,
        "output_tokens": result.usage.output_tokens,
        "token_source": result.usage.source,
        "queue_wait_s": finished.queue_wait_s,
        "ttft_s": finished.ttft_s,
        "itl_p95_s": finished.itl_p95_s,
        "e2e_s": finished.e2e_s,
        "met_objectives": finished.met_objectives,
    }


async def async_run_benchmark(call: ServiceCall) -> ServiceResponse:
    """Calibrate the server on a built-in scenario; optionally apply the recommendation.

    It is applied only when the run could tell the settings apart and the pick measured better
    than the current settings (``core.bench.calibrate.decide``); ``verdict_reason`` says why not.
    A duration whose settings cannot send enough requests to be told apart is refused first.
    """
    entry = _entry(call)
    if call.data[ATTR_APPLY] or call.data[ATTR_FORCE]:
        await async_require_admin(call.hass, call.context)
    runtime = entry.runtime_data
    jobs = runtime.jobs.settings
    # The calibration loads the server for minutes: by default only in the quiet hours.
    if not call.data[ATTR_FORCE] and not jobs.in_window(dt_util.now()):
        raise validation_error(
            "outside_quiet_hours",
            start=jobs.window_start.strftime("%H:%M"),
            end=jobs.window_end.strftime("%H:%M"),
        )
    duration_s: float = call.data[ATTR_DURATION_S]
    scenario = await call.hass.async_add_executor_job(
        load_scenario, call.data[ATTR_SCENARIO]
    )
    # Refused before the minutes it would take: too few requests to tell settings apart.
    sent = measured_requests(scenario, duration_s)
    if sent is not None and sent < MIN_FINISHED_PER_ROW:
        shortest = shortest_duration(scenario)
        raise validation_error(
            "benchmark_too_short",
            scenario=scenario.name,
            duration=f"{duration_s:g}",
            requests=str(sent),
            needed=str(MIN_FINISHED_PER_ROW),
            shortest=str(shortest or MAX_DURATION_S),
        )
    return await async_calibrate(
        call.hass,
        entry,
        scenario=scenario,
        duration_s=duration_s,
        apply=call.data[ATTR_APPLY],
    )


# --- the jobs ------------------------------------------------------------------------------------


def _job_prompt_room(entry: LLMLanesConfigEntry, max_output: int | None) -> int:
    """Return the most prompt tokens a job may have.

    That is its lane's limit, or less: what the server's context leaves beside the answer.
    """
    limits = entry.runtime_data.jobs.limits
    room = limits.max_prompt_tokens
    context = entry.runtime_data.server.context_per_slot
    if context is not None:
        output = max_output or limits.default_output_tokens
        room = min(room, context - output)
    return room


async def _async_prompt(
    hass: HomeAssistant, data: dict[str, Any], max_prompt_tokens: int
) -> JobPrompt:
    """Build the job's prompt from the text or the entities' history."""
    instructions: str | None = data.get(ATTR_INSTRUCTIONS)
    if ATTR_TEXT in data:
        return text_prompt(data[ATTR_TEXT], instructions, max_prompt_tokens)
    if ATTR_ENTITY_IDS not in data:
        raise validation_error("text_or_entities")
    if "recorder" not in hass.config.components:
        raise validation_error("recorder_not_loaded")
    return await async_history_prompt(
        hass,
        data[ATTR_ENTITY_IDS],
        data[ATTR_LOOK_BACK],
        instructions,
        max_prompt_tokens,
    )


async def async_summarize(call: ServiceCall) -> ServiceResponse:
    """Queue a summarization job; with ``run_now`` and ``wait``, return its text once done.

    A caller who waits is answered at once when the job waits for something that takes long
    (the server is down, a retry's back-off, jobs are paused): with the job queued and why.
    """
    hass = call.hass
    data = dict(call.data)
    entry = _entry(call)
    user = await _async_user(call)
    manager = entry.runtime_data.jobs
    max_output = data.get(ATTR_MAX_OUTPUT_TOKENS)
    lane_max = manager.limits.max_output_tokens
    if max_output is not None and max_output > lane_max:
        raise validation_error(
            "max_output_tokens_too_high", value=str(max_output), maximum=str(lane_max)
        )
    target: str | None = data.get(ATTR_NOTIFY_TARGET)
    if target is not None and not notify_target_exists(hass, target):
        raise validation_error("notify_target_not_found", target=target)
    manager.check_room()
    prompt = await _async_prompt(hass, data, _job_prompt_room(entry, max_output))
    name: str | None = data.get(ATTR_NAME)
    requester = await _async_requester(
        call,
        entry,
        user,
        named=job_requester(name) if name else None,
        default=JOBS_REQUESTER,
    )
    job = await manager.async_submit(
        JobSpec(
            prompt=prompt,
            name=name,
            requester=requester,
            user_id=call.context.user_id,
            max_output_tokens=max_output,
            run_now=data[ATTR_RUN_NOW],
            notify_target=target,
            persistent_notification=data[ATTR_PERSISTENT_NOTIFICATION],
            pool=data[ATTR_POOL],
        )
    )
    if data[ATTR_WAIT] and data[ATTR_RUN_NOW] and call.return_response:
        job = await manager.async_wait(job.id, WAIT_TIMEOUT_S, answer_long_waits=True)
    response: dict[str, Any] = {
        ATTR_JOB_ID: job.id,
        ATTR_STATUS: job.status.value,
        ATTR_REQUESTER: job.requester,
        "prompt_note": job.prompt_note,
    }
    if job.status is JobStatus.DONE:
        response["text"] = job.text
        response["prompt_tokens"] = job.prompt_tokens
        response["output_tokens"] = job.output_tokens
    elif job.last_error is not None:
        response["error"] = job.last_error
    if job.wait_reason is not None:
        response["wait_reason"] = job.wait_reason.value
    return response


async def async_cancel_job(call: ServiceCall) -> ServiceResponse:
    """Cancel a queued or running job (of the server named, or of whichever holds it).

    A job a non-admin may not see is not found, as in ``list_jobs``.
    """
    job_id: str = call.data[ATTR_JOB_ID]
    user = await _async_user(call)
    for manager in _job_managers(call):
        if manager.has_job(job_id) and _may_see(user, manager.get(job_id)):
            job = await manager.async_cancel(job_id)
            return {ATTR_JOB_ID: job.id, ATTR_STATUS: job.status.value}
    raise validation_error("job_not_found", job_id=job_id)


async def async_list_jobs(call: ServiceCall) -> ServiceResponse:
    """List the jobs of one entry (or of every loaded entry), oldest first.

    A non-admin sees only the jobs they asked for.
    """
    wanted: set[str] | None = (
        set(call.data[ATTR_STATUS]) if ATTR_STATUS in call.data else None
    )
    user = await _async_user(call)
    jobs: list[Any] = [
        {**job.as_response(), ATTR_CONFIG_ENTRY_ID: manager.entry_id}
        for manager in _job_managers(call)
        for job in manager.jobs()
        if (wanted is None or job.status.value in wanted) and _may_see(user, job)
    ]
    return {"jobs": jobs}


ACTIONS: tuple[
    tuple[
        str,
        Callable[[ServiceCall], Coroutine[Any, Any, ServiceResponse]],
        probatio.Schema,
        SupportsResponse,
    ],
    ...,
] = (
    (SERVICE_GENERATE, async_generate, GENERATE_SCHEMA, SupportsResponse.ONLY),
    (
        SERVICE_RUN_BENCHMARK,
        async_run_benchmark,
        RUN_BENCHMARK_SCHEMA,
        SupportsResponse.ONLY,
    ),
    (SERVICE_SUMMARIZE, async_summarize, SUMMARIZE_SCHEMA, SupportsResponse.OPTIONAL),
    (
        SERVICE_CANCEL_JOB,
        async_cancel_job,
        CANCEL_JOB_SCHEMA,
        SupportsResponse.OPTIONAL,
    ),
    (SERVICE_LIST_JOBS, async_list_jobs, LIST_JOBS_SCHEMA, SupportsResponse.ONLY),
)
"""Every action: name, handler, schema, and whether it answers with response data."""


@callback
def async_setup_services(hass: HomeAssistant) -> None:
    """Register the integration's actions (once, whatever the number of servers)."""
    for name, handler, schema, supports_response in ACTIONS:
        hass.services.async_register(
            DOMAIN, name, handler, schema=schema, supports_response=supports_response
        )
