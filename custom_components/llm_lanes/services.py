"""Actions of LLM Lanes: ``generate`` and ``run_benchmark``.

``generate`` sends one request through a server's scheduler; ``run_benchmark`` runs a short
calibration on the server and recommends a setting.
"""

from __future__ import annotations

from typing import Any

from homeassistant.const import ATTR_CONFIG_ENTRY_ID
from homeassistant.core import (
    HomeAssistant,
    ServiceCall,
    ServiceResponse,
    SupportsResponse,
    callback,
)
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import config_validation as cv, service
from homeassistant.util import dt as dt_util
import probatio

from .const import CONF_MODEL, DOMAIN, OPT_MAX_SEQUENCES, OPT_PREFILL_BUDGET
from .core.backends.base import ChatMessage, ChatRequest
from .core.bench.calibrate import DEFAULT_SCENARIO, calibrate
from .core.bench.workload import builtin_scenarios
from .core.errors import LanesError, LimitExceededError
from .core.lanes import Lane
from .models import LLMLanesConfigEntry
from .requesters import requester_for_context

SERVICE_GENERATE = "generate"
ATTR_PROMPT = "prompt"
ATTR_INSTRUCTIONS = "instructions"
ATTR_LANE = "lane"
ATTR_REQUESTER = "requester"
ATTR_MAX_TOKENS = "max_tokens"
ATTR_MODEL = "model"
GENERATE_DEFAULT_REQUESTER = "generate"
SERVICE_RUN_BENCHMARK = "run_benchmark"
ATTR_SCENARIO = "scenario"
ATTR_DURATION_S = "duration_s"
ATTR_APPLY = "apply"
ATTR_FORCE = "force"
APPLIED_SETTINGS = {OPT_MAX_SEQUENCES: int, OPT_PREFILL_BUDGET: int}
"""Calibrated settings that ``apply`` writes into the entry's options."""

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


async def async_generate(call: ServiceCall) -> ServiceResponse:
    """Send one prompt through the chosen server's scheduler and return the answer."""
    entry: LLMLanesConfigEntry = service.async_get_config_entry(
        call.hass, DOMAIN, call.data[ATTR_CONFIG_ENTRY_ID]
    )
    messages: list[ChatMessage] = []
    if instructions := call.data.get(ATTR_INSTRUCTIONS):
        messages.append(ChatMessage(role="system", content=instructions))
    messages.append(ChatMessage(role="user", content=call.data[ATTR_PROMPT]))
    request = ChatRequest(
        model=call.data.get(ATTR_MODEL) or entry.data[CONF_MODEL],
        messages=tuple(messages),
        max_tokens=call.data.get(ATTR_MAX_TOKENS),
    )
    lane = Lane.from_key(call.data[ATTR_LANE])
    requester = call.data.get(ATTR_REQUESTER) or requester_for_context(
        call.hass, call.context, GENERATE_DEFAULT_REQUESTER
    )
    try:
        result = await entry.runtime_data.scheduler.generate(
            request, lane=lane, requester=requester
        )
    except LimitExceededError as err:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key=err.translation_key,
            translation_placeholders=err.placeholders,
        ) from err
    except LanesError as err:
        raise HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key=err.translation_key,
            translation_placeholders=err.placeholders,
        ) from err
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
    entry: LLMLanesConfigEntry = service.async_get_config_entry(
        call.hass, DOMAIN, call.data[ATTR_CONFIG_ENTRY_ID]
    )
    runtime = entry.runtime_data
    jobs = runtime.jobs.settings
    # The calibration loads the server for minutes: by default only in the quiet hours.
    if not call.data[ATTR_FORCE] and not jobs.in_window(dt_util.now()):
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="outside_quiet_hours",
            translation_placeholders={
                "start": jobs.window_start.strftime("%H:%M"),
                "end": jobs.window_end.strftime("%H:%M"),
            },
        )
    try:
        result = await calibrate(
            runtime.backend,
            runtime.scheduler.settings,
            scenario=call.data[ATTR_SCENARIO],
            duration_s=call.data[ATTR_DURATION_S],
            model=entry.data[CONF_MODEL],
        )
    except LanesError as err:
        raise HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key=err.translation_key,
            translation_placeholders=err.placeholders,
        ) from err
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


@callback
def async_setup_services(hass: HomeAssistant) -> None:
    """Register the integration's actions."""
    hass.services.async_register(
        DOMAIN,
        SERVICE_GENERATE,
        async_generate,
        schema=GENERATE_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_RUN_BENCHMARK,
        async_run_benchmark,
        schema=RUN_BENCHMARK_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
