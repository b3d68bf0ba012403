"""Job sensors, the pause switch and the job options, on a real entry against the simulated server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import STATE_OFF, STATE_ON
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
import homeassistant.util.dt as dt_util
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    DOMAIN,
    OPT_JOBS_MAX_IN_FLIGHT,
    OPT_JOBS_NIGHTLY_BUDGET,
    OPT_JOBS_RETENTION_DAYS,
    OPT_JOBS_TOKENS_PER_MINUTE,
    OPT_NIGHTLY_END,
    OPT_NIGHTLY_START,
)
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.jobs.model import JobStatus, WaitReason

from .support.requests import async_summarize


@pytest.fixture
async def manager(
    ha_core: HomeAssistant, mock_config_entry: MockConfigEntry
) -> AsyncIterator[JobManager]:
    """Load the entry with a window that never closes and a nightly budget of 1000 tokens."""
    hass = ha_core
    mock_config_entry.add_to_hass(hass)
    hass.config_entries.async_update_entry(
        mock_config_entry,
        options={
            OPT_NIGHTLY_START: "00:00:00",
            OPT_NIGHTLY_END: "00:00:00",
            OPT_JOBS_NIGHTLY_BUDGET: 1000,
        },
    )
    assert await hass.config_entries.async_setup(mock_config_entry.entry_id)
    await hass.async_block_till_done()
    assert mock_config_entry.state is ConfigEntryState.LOADED
    yield mock_config_entry.runtime_data.jobs
    assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


def state(hass: HomeAssistant, entry_id: str, platform: str, key: str) -> str:
    """Return the state of the job entity with this key."""
    entity_id = er.async_get(hass).async_get_entity_id(
        platform, DOMAIN, f"{entry_id}_{key}"
    )
    assert entity_id is not None
    found = hass.states.get(entity_id)
    assert found is not None
    return found.state


async def test_sensors_follow_the_jobs(
    hass: HomeAssistant, manager: JobManager
) -> None:
    """Waiting, done tonight, tokens tonight and budget used follow the jobs; the switch pauses.

    The window never closes here (the simulated server runs on the real clock).
    """
    entry_id = manager.entry_id
    paused = er.async_get(hass).async_get_entity_id(
        "switch", DOMAIN, f"{entry_id}_jobs_paused"
    )
    assert paused is not None

    await hass.services.async_call(
        "switch", "turn_on", {"entity_id": paused}, blocking=True
    )
    assert state(hass, entry_id, "switch", "jobs_paused") == STATE_ON
    assert manager.paused

    await async_summarize(hass, text="The heating ran all afternoon.", name="heating")
    assert state(hass, entry_id, "sensor", "jobs_waiting") == "1"
    [job] = manager.jobs()
    assert job.wait_reason is WaitReason.PAUSED

    await hass.services.async_call(
        "switch", "turn_off", {"entity_id": paused}, blocking=True
    )
    assert state(hass, entry_id, "switch", "jobs_paused") == STATE_OFF
    assert (await manager.async_wait(job.id, 60)).status is JobStatus.DONE
    await hass.async_block_till_done()
    assert state(hass, entry_id, "sensor", "jobs_waiting") == "0"
    assert state(hass, entry_id, "sensor", "jobs_done_tonight") == "1"
    used = job.prompt_tokens + job.output_tokens
    assert state(hass, entry_id, "sensor", "job_tokens_tonight") == str(used)
    assert float(state(hass, entry_id, "sensor", "job_budget_used")) == pytest.approx(
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
    tokens_id = er.async_get(hass).async_get_entity_id(
        "sensor", DOMAIN, f"{entry.entry_id}_job_tokens_tonight"
    )
    assert tokens_id is not None
    tokens_state = hass.states.get(tokens_id)
    assert tokens_state is not None
    assert tokens_state.attributes["budget"] == 5000

    queued = await async_summarize(
        hass, text="The porch light stayed on.", name="porch"
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
