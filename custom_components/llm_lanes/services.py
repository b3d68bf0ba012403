"""The actions of LLM Lanes: ``generate``, ``run_benchmark``, ``summarize``, ``cancel_job``, ``list_jobs``.

Each action names its server by ``config_entry_id`` (optional where the only loaded server will
do), and every one resolves it the same way (``_loaded_entries``). Engine errors become translated
Home Assistant errors through ``translated_errors``; every other error an action raises is
translated too (``validation_error``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import ATTR_CONFIG_ENTRY_ID
from homeassistant.core import (
    HomeAssistant,
    ServiceCall,
    ServiceResponse,
    SupportsResponse,
    callback,
)
from homeassistant.helpers import config_validation as cv
from homeassistant.util import dt as dt_util
import probatio

from .const import CONF_MODEL, DOMAIN, OPT_MAX_SEQUENCES, OPT_PREFILL_BUDGET
from .coordinator import LLMLanesConfigEntry
from .core.backends.base import ChatMessage, ChatRequest
from .core.bench.calibrate import DEFAULT_SCENARIO, calibrate
from .core.bench.workload import builtin_scenarios
from .core.lanes import Lane
from .errors import translated_errors, validation_error
from .jobs.delivery import notify_target_exists
from .jobs.manager import JobManager
from .jobs.model import JobSpec, JobStatus
from .jobs.prompts import JobPrompt, async_history_prompt, text_prompt
from .requesters import requester_for_context

SERVICE_GENERATE = "generate"
SERVICE_RUN_BENCHMARK = "run_benchmark"
SERVICE_SUMMARIZE = "summarize"
SERVICE_CANCEL_JOB = "cancel_job"
SERVICE_LIST_JOBS = "list_jobs"

ATTR_PROMPT = "prompt"
ATTR_INSTRUCTIONS = "instructions"
ATTR_LANE = "lane"
ATTR_REQUESTER = "requester"
ATTR_MAX_TOKENS = "max_tokens"
ATTR_MODEL = "model"
ATTR_SCENARIO = "scenario"
ATTR_DURATION_S = "duration_s"
ATTR_APPLY = "apply"
ATTR_FORCE = "force"
ATTR_NAME = "name"
ATTR_TEXT = "text"
ATTR_ENTITY_IDS = "entity_ids"
ATTR_LOOK_BACK = "look_back"
ATTR_MAX_OUTPUT_TOKENS = "max_output_tokens"
ATTR_RUN_NOW = "run_now"
ATTR_WAIT = "wait"
ATTR_NOTIFY_TARGET = "notify_target"
ATTR_PERSISTENT_NOTIFICATION = "persistent_notification"
ATTR_JOB_ID = "job_id"
ATTR_STATUS = "status"

GENERATE_DEFAULT_REQUESTER = "generate"
APPLIED_SETTINGS = {OPT_MAX_SEQUENCES: int, OPT_PREFILL_BUDGET: int}
"""Calibrated settings that ``apply`` writes into the entry's options."""
DEFAULT_LOOK_BACK = timedelta(hours=24)
WAIT_TIMEOUT_S = 900.0
"""The longest ``summarize`` with ``wait`` holds the caller; the job goes on afterwards."""

GENERATE_SCHEMA = probatio.Schema(
    {
        probatio.Required(ATTR_CONFIG_ENTRY_ID): cv.string,
        probatio.Required(ATTR_PROMPT): probatio.All(cv.string, probatio.Length(min=1)),
        probatio.Optional(ATTR_INSTRUCTIONS): cv.string,
        probatio.Optional(ATTR_LANE, default=Lane.AUTOMATION.key): probatio.In(
            [lane.key for lane in Lane]
        ),
        probatio.Optional(ATTR_REQUESTER): probatio.All(
            cv.string, probatio.Length(min=1)
        ),
        probatio.Optional(ATTR_MAX_TOKENS): probatio.All(
            probatio.Coerce(int), probatio.Range(min=1)
        ),
        probatio.Optional(ATTR_MODEL): cv.string,
    }
)
RUN_BENCHMARK_SCHEMA = probatio.Schema(
    {
        probatio.Required(ATTR_CONFIG_ENTRY_ID): cv.string,
        probatio.Optional(ATTR_SCENARIO, default=DEFAULT_SCENARIO): probatio.In(
            sorted(builtin_scenarios())
        ),
        probatio.Optional(ATTR_DURATION_S, default=30.0): probatio.All(
            probatio.Coerce(float), probatio.Range(min=1, max=600)
        ),
        probatio.Optional(ATTR_APPLY, default=False): cv.boolean,
        probatio.Optional(ATTR_FORCE, default=False): cv.boolean,
    }
)
SUMMARIZE_SCHEMA = probatio.Schema(
    {
        probatio.Optional(ATTR_CONFIG_ENTRY_ID): cv.string,
        probatio.Optional(ATTR_NAME): cv.string,
        probatio.Exclusive(ATTR_TEXT, "source"): cv.string,
        probatio.Exclusive(ATTR_ENTITY_IDS, "source"): cv.entity_ids,
        probatio.Optional(ATTR_LOOK_BACK, default=DEFAULT_LOOK_BACK): probatio.All(
            cv.positive_time_period, probatio.Range(min=timedelta(minutes=1))
        ),
        probatio.Optional(ATTR_INSTRUCTIONS): cv.string,
        probatio.Optional(ATTR_REQUESTER): cv.string,
        probatio.Optional(ATTR_MAX_OUTPUT_TOKENS): probatio.All(
            probatio.Coerce(int), probatio.Range(min=1)
        ),
        probatio.Optional(ATTR_RUN_NOW, default=False): cv.boolean,
        probatio.Optional(ATTR_WAIT, default=False): cv.boolean,
        probatio.Optional(ATTR_NOTIFY_TARGET): cv.string,
        probatio.Optional(ATTR_PERSISTENT_NOTIFICATION, default=False): cv.boolean,
    }
)
CANCEL_JOB_SCHEMA = probatio.Schema(
    {
        probatio.Optional(ATTR_CONFIG_ENTRY_ID): cv.string,
        probatio.Required(ATTR_JOB_ID): cv.string,
    }
)
LIST_JOBS_SCHEMA = probatio.Schema(
    {
        probatio.Optional(ATTR_CONFIG_ENTRY_ID): cv.string,
        probatio.Optional(ATTR_STATUS): probatio.All(
            cv.ensure_list, [probatio.In([status.value for status in JobStatus])]
        ),
    }
)


# --- which server -----------------------------------------------------------------------------


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


# --- generate and run_benchmark -----------------------------------------------------------------


async def async_generate(call: ServiceCall) -> ServiceResponse:
    """Send one prompt through the chosen server's scheduler and return the answer."""
    entry = _entry(call)
    messages: list[ChatMessage] = []
    if instructions := call.data.get(ATTR_INSTRUCTIONS):
        messages.append(ChatMessage(role="system", content=instructions))
    messages.append(ChatMessage(role="user", content=call.data[ATTR_PROMPT]))
    request = ChatRequest(
        model=call.data.get(ATTR_MODEL) or entry.data[CONF_MODEL],
        messages=tuple(messages),
        max_tokens=call.data.get(ATTR_MAX_TOKENS),
    )
    requester = call.data.get(ATTR_REQUESTER) or requester_for_context(
        call.hass, call.context, GENERATE_DEFAULT_REQUESTER
    )
    with translated_errors():
        result = await entry.runtime_data.scheduler.generate(
            request, lane=Lane.from_key(call.data[ATTR_LANE]), requester=requester
        )
    finished = result.finished
    return {
        "text": result.text,
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
    """Calibrate the server on a built-in scenario; optionally apply the recommendation."""
    entry = _entry(call)
    runtime = entry.runtime_data
    jobs = runtime.jobs.settings
    # The calibration loads the server for minutes: by default only in the quiet hours.
    if not call.data[ATTR_FORCE] and not jobs.in_window(dt_util.now()):
        raise validation_error(
            "outside_quiet_hours",
            start=jobs.window_start.strftime("%H:%M"),
            end=jobs.window_end.strftime("%H:%M"),
        )
    with translated_errors():
        result = await calibrate(
            runtime.backend,
            runtime.scheduler.settings,
            scenario=call.data[ATTR_SCENARIO],
            duration_s=call.data[ATTR_DURATION_S],
            model=entry.data[CONF_MODEL],
        )
    response: dict[str, Any] = result.as_response()
    applied = {
        key: convert(result.recommended_values[key])
        for key, convert in APPLIED_SETTINGS.items()
        if key in result.recommended_values
    }
    if call.data[ATTR_APPLY] and applied:
        call.hass.config_entries.async_update_entry(
            entry, options={**entry.options, **applied}
        )
    response["applied"] = applied if call.data[ATTR_APPLY] else {}
    return response


# --- the jobs ------------------------------------------------------------------------------------


async def _async_prompt(
    hass: HomeAssistant, manager: JobManager, data: dict[str, Any]
) -> JobPrompt:
    """Build the job's prompt from the text or the entities' history."""
    max_prompt_tokens = manager.max_prompt_tokens
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
    """Queue a summarization job; with ``run_now`` and ``wait``, return its text once done."""
    hass = call.hass
    data = dict(call.data)
    manager = _entry(call).runtime_data.jobs
    max_output = data.get(ATTR_MAX_OUTPUT_TOKENS)
    lane_max = manager.max_output_tokens
    if max_output is not None and max_output > lane_max:
        raise validation_error(
            "max_output_tokens_too_high", value=str(max_output), maximum=str(lane_max)
        )
    target: str | None = data.get(ATTR_NOTIFY_TARGET)
    if target is not None and not notify_target_exists(hass, target):
        raise validation_error("notify_target_not_found", target=target)
    prompt = await _async_prompt(hass, manager, data)
    job = await manager.async_submit(
        JobSpec(
            prompt=prompt,
            name=data.get(ATTR_NAME),
            requester=data.get(ATTR_REQUESTER),
            max_output_tokens=max_output,
            run_now=data[ATTR_RUN_NOW],
            notify_target=target,
            persistent_notification=data[ATTR_PERSISTENT_NOTIFICATION],
        )
    )
    if data[ATTR_WAIT] and data[ATTR_RUN_NOW] and call.return_response:
        job = await manager.async_wait(job.id, WAIT_TIMEOUT_S)
    response: dict[str, Any] = {
        ATTR_JOB_ID: job.id,
        ATTR_STATUS: job.status.value,
        "prompt_note": job.prompt_note,
    }
    if job.status is JobStatus.DONE:
        response["text"] = job.text
        response["prompt_tokens"] = job.prompt_tokens
        response["output_tokens"] = job.output_tokens
    elif job.status is JobStatus.FAILED:
        response["error"] = job.last_error
    elif job.wait_reason is not None:
        response["wait_reason"] = job.wait_reason.value
    return response


async def async_cancel_job(call: ServiceCall) -> ServiceResponse:
    """Cancel a queued or running job (of the server named, or of whichever holds it)."""
    job_id: str = call.data[ATTR_JOB_ID]
    for manager in _job_managers(call):
        if manager.has_job(job_id):
            job = await manager.async_cancel(job_id)
            return {ATTR_JOB_ID: job.id, ATTR_STATUS: job.status.value}
    raise validation_error("job_not_found", job_id=job_id)


async def async_list_jobs(call: ServiceCall) -> ServiceResponse:
    """List the jobs of one entry (or of every loaded entry), oldest first."""
    wanted: set[str] | None = (
        set(call.data[ATTR_STATUS]) if ATTR_STATUS in call.data else None
    )
    jobs: list[Any] = [
        {**job.as_response(), ATTR_CONFIG_ENTRY_ID: manager.entry_id}
        for manager in _job_managers(call)
        for job in manager.jobs()
        if wanted is None or job.status.value in wanted
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
