"""The job actions: ``llm_lanes.summarize``, ``llm_lanes.cancel_job`` and ``llm_lanes.list_jobs``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from homeassistant.core import (
    HomeAssistant,
    ServiceCall,
    ServiceResponse,
    SupportsResponse,
    callback,
)
from homeassistant.exceptions import ServiceValidationError
from homeassistant.helpers import config_validation as cv
import probatio

from .const import DOMAIN
from .job_history import JobPrompt, async_history_prompt, text_prompt
from .job_store import JobStatus
from .jobs import (
    JobFinishedError,
    JobManager,
    JobNotFoundError,
    JobSpec,
    notify_target_exists,
)
from .models import LLMLanesConfigEntry

SERVICE_SUMMARIZE = "summarize"
SERVICE_CANCEL_JOB = "cancel_job"
SERVICE_LIST_JOBS = "list_jobs"

ATTR_CONFIG_ENTRY_ID = "config_entry_id"
ATTR_NAME = "name"
ATTR_TEXT = "text"
ATTR_ENTITY_IDS = "entity_ids"
ATTR_LOOK_BACK = "look_back"
ATTR_INSTRUCTIONS = "instructions"
ATTR_REQUESTER = "requester"
ATTR_MAX_OUTPUT_TOKENS = "max_output_tokens"
ATTR_RUN_NOW = "run_now"
ATTR_WAIT = "wait"
ATTR_NOTIFY_TARGET = "notify_target"
ATTR_PERSISTENT_NOTIFICATION = "persistent_notification"
ATTR_JOB_ID = "job_id"
ATTR_STATUS = "status"

DEFAULT_LOOK_BACK = timedelta(hours=24)
WAIT_TIMEOUT_S = 900.0
"""The longest ``summarize`` with ``wait`` holds the caller; the job goes on afterwards."""

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


def _managers(hass: HomeAssistant) -> dict[str, JobManager]:
    """Return the job manager of every loaded entry, by entry id."""
    entries: list[LLMLanesConfigEntry] = hass.config_entries.async_loaded_entries(
        DOMAIN
    )
    return {entry.entry_id: entry.runtime_data.jobs for entry in entries}


def _manager_for(hass: HomeAssistant, entry_id: str | None) -> JobManager:
    """Return the job manager of the given entry, or of the only loaded one."""
    managers = _managers(hass)
    if entry_id is not None:
        if entry_id not in managers:
            raise ServiceValidationError(
                translation_domain=DOMAIN,
                translation_key="entry_not_loaded",
                translation_placeholders={"entry_id": entry_id},
            )
        return managers[entry_id]
    if not managers:
        raise ServiceValidationError(
            translation_domain=DOMAIN, translation_key="no_server_loaded"
        )
    if len(managers) > 1:
        raise ServiceValidationError(
            translation_domain=DOMAIN, translation_key="several_servers"
        )
    return next(iter(managers.values()))


def _manager_with_job(
    hass: HomeAssistant, entry_id: str | None, job_id: str
) -> JobManager:
    """Return the manager that holds the job (searching every loaded entry when none is given)."""
    candidates = (
        [_manager_for(hass, entry_id)] if entry_id else list(_managers(hass).values())
    )
    for manager in candidates:
        try:
            manager.get(job_id)
        except JobNotFoundError:
            continue
        return manager
    raise ServiceValidationError(
        translation_domain=DOMAIN,
        translation_key="job_not_found",
        translation_placeholders={"job_id": job_id},
    )


async def _async_prompt(
    hass: HomeAssistant, manager: JobManager, data: dict[str, Any]
) -> JobPrompt:
    """Build the job's prompt from the text or the entities' history."""
    max_prompt_tokens = manager.max_prompt_tokens
    instructions: str | None = data.get(ATTR_INSTRUCTIONS)
    if ATTR_TEXT in data:
        return text_prompt(data[ATTR_TEXT], instructions, max_prompt_tokens)
    if ATTR_ENTITY_IDS not in data:
        raise ServiceValidationError(
            translation_domain=DOMAIN, translation_key="text_or_entities"
        )
    if "recorder" not in hass.config.components:
        raise ServiceValidationError(
            translation_domain=DOMAIN, translation_key="recorder_not_loaded"
        )
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
    manager = _manager_for(hass, data.get(ATTR_CONFIG_ENTRY_ID))
    max_output = data.get(ATTR_MAX_OUTPUT_TOKENS)
    lane_max = manager.max_output_tokens
    if max_output is not None and max_output > lane_max:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="max_output_tokens_too_high",
            translation_placeholders={
                "value": str(max_output),
                "maximum": str(lane_max),
            },
        )
    target: str | None = data.get(ATTR_NOTIFY_TARGET)
    if target is not None and not notify_target_exists(hass, target):
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="notify_target_not_found",
            translation_placeholders={"target": target},
        )
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
    """Cancel a queued or running job."""
    job_id: str = call.data[ATTR_JOB_ID]
    manager = _manager_with_job(call.hass, call.data.get(ATTR_CONFIG_ENTRY_ID), job_id)
    try:
        job = await manager.async_cancel(job_id)
    except JobFinishedError as err:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="job_already_finished",
            translation_placeholders={
                "job_id": job_id,
                "status": manager.get(job_id).status.value,
            },
        ) from err
    return {ATTR_JOB_ID: job.id, ATTR_STATUS: job.status.value}


async def async_list_jobs(call: ServiceCall) -> ServiceResponse:
    """List the jobs of one entry (or of every loaded entry), oldest first."""
    entry_id: str | None = call.data.get(ATTR_CONFIG_ENTRY_ID)
    managers = (
        [_manager_for(call.hass, entry_id)]
        if entry_id
        else list(_managers(call.hass).values())
    )
    wanted: set[str] | None = (
        set(call.data[ATTR_STATUS]) if ATTR_STATUS in call.data else None
    )
    jobs: list[Any] = [
        {**job.as_response(), ATTR_CONFIG_ENTRY_ID: manager.entry_id}
        for manager in managers
        for job in manager.jobs()
        if wanted is None or job.status.value in wanted
    ]
    return {"jobs": jobs}


@callback
def async_setup_job_services(hass: HomeAssistant) -> None:
    """Register the job actions (once, whatever the number of servers)."""
    hass.services.async_register(
        DOMAIN,
        SERVICE_SUMMARIZE,
        async_summarize,
        schema=SUMMARIZE_SCHEMA,
        supports_response=SupportsResponse.OPTIONAL,
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_CANCEL_JOB,
        async_cancel_job,
        schema=CANCEL_JOB_SCHEMA,
        supports_response=SupportsResponse.OPTIONAL,
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_LIST_JOBS,
        async_list_jobs,
        schema=LIST_JOBS_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
