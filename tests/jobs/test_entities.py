"""Job sensors, the pause switch and the job options, on a real entry against the simulated server."""

from __future__ import annotations

from datetime import timedelta

from homeassistant.const import STATE_OFF, STATE_ON
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
import homeassistant.util.dt as dt_util
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    OPT_JOBS_MAX_IN_FLIGHT,
    OPT_JOBS_NIGHTLY_BUDGET,
    OPT_JOBS_RETENTION_DAYS,
    OPT_JOBS_TOKENS_PER_MINUTE,
    OPT_NIGHTLY_END,
    OPT_NIGHTLY_START,
)
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.jobs.model import JobStatus, WaitReason
from tests.support.entities import (
    async_call_entity_action,
    async_set_options,
    entity_id_for,
    state_of,
)
from tests.support.requests import async_call_action


@pytest.fixture
async def manager(hass: HomeAssistant, init_integration: MockConfigEntry) -> JobManager:
    """Return the loaded entry's jobs, with a window that never closes and a budget of 1000."""
    await async_set_options(
        hass,
        init_integration,
        **{
            OPT_NIGHTLY_START: "00:00:00",
            OPT_NIGHTLY_END: "00:00:00",
            OPT_JOBS_NIGHTLY_BUDGET: 1000,
        },
    )
    return init_integration.runtime_data.jobs


async def test_sensors_follow_the_jobs(
    hass: HomeAssistant, init_integration: MockConfigEntry, manager: JobManager
) -> None:
    """Waiting, done tonight, tokens tonight and budget used follow the jobs; the switch pauses.

    The window never closes here (the simulated server runs on the real clock).
    """
    entry = init_integration
    await async_call_entity_action(hass, entry, "switch", "jobs_paused", "turn_on")
    assert state_of(hass, entry, "switch", "jobs_paused") == STATE_ON
    assert manager.paused

    await async_call_action(
        hass, "summarize", text="The heating ran all afternoon.", name="heating"
    )
    assert state_of(hass, entry, "sensor", "jobs_waiting") == "1"
    [job] = manager.jobs()
    assert job.wait_reason is WaitReason.PAUSED

    await async_call_entity_action(hass, entry, "switch", "jobs_paused", "turn_off")
    assert state_of(hass, entry, "switch", "jobs_paused") == STATE_OFF
    assert (await manager.async_wait(job.id, 60)).status is JobStatus.DONE
    await hass.async_block_till_done()
    assert state_of(hass, entry, "sensor", "jobs_waiting") == "0"
    assert state_of(hass, entry, "sensor", "jobs_done_tonight") == "1"
    used = job.prompt_tokens + job.output_tokens
    assert state_of(hass, entry, "sensor", "job_tokens_tonight") == str(used)
    assert float(state_of(hass, entry, "sensor", "job_budget_used")) == pytest.approx(
        100 * used / 1000
    )


async def test_job_options_apply_live(
    hass: HomeAssistant, manager: JobManager, mock_config_entry: MockConfigEntry
) -> None:
    """The options flow's job settings reach the running manager and its entities, no reload.

    A job queued outside a window that ends before now starts once the window is widened.
    """
    entry = mock_config_entry
    scheduler = entry.runtime_data.scheduler
    now = dt_util.now()
    closed_start = (now + timedelta(hours=2)).strftime("%H:%M:%S")
    closed_end = (now + timedelta(hours=3)).strftime("%H:%M:%S")

    result = await hass.config_entries.options.async_init(entry.entry_id)
    assert result["type"] is FlowResultType.FORM
    schema_keys = {str(key) for key in result["data_schema"].schema}
    assert {
        OPT_JOBS_MAX_IN_FLIGHT,
        OPT_JOBS_TOKENS_PER_MINUTE,
        OPT_JOBS_NIGHTLY_BUDGET,
        OPT_JOBS_RETENTION_DAYS,
    } <= schema_keys
    result = await hass.config_entries.options.async_configure(
        result["flow_id"],
        {
            OPT_NIGHTLY_START: closed_start,
            OPT_NIGHTLY_END: closed_end,
            OPT_JOBS_MAX_IN_FLIGHT: 2.0,
            OPT_JOBS_TOKENS_PER_MINUTE: 600.0,
            OPT_JOBS_NIGHTLY_BUDGET: 5000.0,
            OPT_JOBS_RETENTION_DAYS: 3.0,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert entry.options[OPT_JOBS_MAX_IN_FLIGHT] == 2
    assert isinstance(entry.options[OPT_JOBS_NIGHTLY_BUDGET], int)
    assert entry.runtime_data.jobs is manager  # applied live, no reload
    assert entry.runtime_data.scheduler is scheduler
    settings = manager.settings
    assert (settings.max_in_flight, settings.tokens_per_minute) == (2, 600)
    assert (settings.nightly_token_budget, settings.retention_days) == (5000, 3)
    assert settings.window_start.strftime("%H:%M:%S") == closed_start
    tokens_state = hass.states.get(
        entity_id_for(hass, entry, "sensor", "job_tokens_tonight")
    )
    assert tokens_state is not None
    assert tokens_state.attributes["budget"] == 5000

    queued = await async_call_action(
        hass, "summarize", text="The porch light stayed on.", name="porch"
    )
    assert queued["status"] == "queued"
    assert queued["wait_reason"] == WaitReason.OUTSIDE_WINDOW.value

    result = await hass.config_entries.options.async_init(entry.entry_id)
    result = await hass.config_entries.options.async_configure(
        result["flow_id"], {OPT_NIGHTLY_START: "00:00:00", OPT_NIGHTLY_END: "00:00:00"}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    job = await manager.async_wait(queued["job_id"], 60)
    assert job.status is JobStatus.DONE
    assert manager.settings.nightly_token_budget == 5000  # untouched options are kept
