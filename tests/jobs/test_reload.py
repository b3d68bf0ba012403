"""A job streaming when its entry unloads runs again, exactly once, after the entry reloads.

The entry is real (the scheduler, backend and job manager of a loaded config entry) against a
simulated server running at its cost model's real pace, so the job is still streaming when the
entry reloads.
"""

from __future__ import annotations

import asyncio
from typing import Any

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_capture_events,
)

from custom_components.llm_lanes.const import EVENT_SUMMARY_READY
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from custom_components.llm_lanes.jobs.model import JobStatus
from custom_components.llm_lanes.jobs.store import storage_key
from tests.support.entries import REAL_SPEED_SIM
from tests.support.requests import async_call_action

pytestmark = pytest.mark.parametrize("sim_config", [REAL_SPEED_SIM], ids=["real_speed"])


async def test_job_interrupted_by_a_reload_completes_exactly_once(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_storage: dict[str, Any],
) -> None:
    """The unload stops the stream and stores the job as interrupted; the reload runs it once."""
    entry = init_integration
    events = async_capture_events(hass, EVENT_SUMMARY_READY)
    first_scheduler = entry.runtime_data.scheduler
    first_finished: list[FinishedRequest] = []
    first_scheduler.add_listener(first_finished.append)

    queued = await async_call_action(
        hass,
        "summarize",
        text="The washing machine ran twice.",
        run_now=True,
        max_output_tokens=300,  # about 3 s at the simulator's real pace: still streaming below
    )
    job_id = queued["job_id"]
    async with asyncio.timeout(30):
        while first_scheduler.snapshot().lanes[Lane.BACKGROUND].in_flight == 0:
            await asyncio.sleep(0.01)
    assert entry.runtime_data.jobs.get(job_id).status is JobStatus.RUNNING

    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert entry.state is ConfigEntryState.NOT_LOADED
    [stored] = hass_storage[storage_key(entry.entry_id)]["data"]["jobs"]
    assert stored["id"] == job_id
    assert stored["status"] == "queued"
    assert stored["interrupted"] is True
    assert [request.outcome for request in first_finished] != ["ok"]
    assert events == []

    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    manager = entry.runtime_data.jobs
    assert entry.runtime_data.scheduler is not first_scheduler
    job = await manager.async_wait(job_id, 60)
    assert job.status is JobStatus.DONE
    assert job.attempts == 1  # the interrupted start does not count
    assert job.text
    await hass.async_block_till_done(wait_background_tasks=True)
    assert [event.data["job_id"] for event in events] == [job_id]

    # A second reload finds the job finished and never runs it again.
    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert entry.runtime_data.jobs.get(job_id).status is JobStatus.DONE
    assert entry.runtime_data.scheduler.snapshot().lanes[Lane.BACKGROUND].in_flight == 0
    assert len(events) == 1
