"""What ``run_benchmark`` measured, kept across restarts, and forgotten when the server changes.

Against the simulated server, restarted as an owner would restart a real one (another context
size, another quantization of the same model): the learned curve and the settings the
calibration applied are forgotten, a repair says so, and its fix flow plans a re-calibration
that runs in the night's job window.
"""

from __future__ import annotations

from homeassistant.components.repairs import DOMAIN as REPAIRS_DOMAIN
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import issue_registry as ir
from homeassistant.setup import async_setup_component
from homeassistant.util import dt as dt_util
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
)

from custom_components.llm_lanes.calibration import stale_issue_id
from custom_components.llm_lanes.calibration_record import (
    Calibration,
    CalibrationRecord,
)
from custom_components.llm_lanes.const import (
    DOMAIN,
    OPT_MAX_SEQUENCES,
    OPT_NIGHTLY_END,
    OPT_NIGHTLY_START,
    OPT_PREFILL_GUARD,
)
from custom_components.llm_lanes.jobs.recalibration import CHECK_INTERVAL
from custom_components.llm_lanes.served_model import ServedModel
from tools.simulator.server import SimulatedServer

from .support.entities import async_set_options
from .support.requests import async_call_action


async def _calibrated(
    hass: HomeAssistant, entry: MockConfigEntry, **applied: int
) -> CalibrationRecord:
    """Run a (too short) calibration, then record ``applied`` as what it applied, set so."""
    await async_call_action(
        hass,
        "run_benchmark",
        config_entry_id=entry.entry_id,
        scenario="voice_vs_background",
        duration_s=1,
        force=True,
    )
    calibration = entry.runtime_data.calibration
    record = calibration.record
    assert record is not None and record.curve
    record.applied = dict(applied)
    await calibration.async_save()
    await async_set_options(hass, entry, **applied)
    return record


def test_what_a_measurement_holds_for() -> None:
    """Another model, variant or context changes it; what a server does not say does not."""
    measured = ServedModel("qwen3:8b", "abc Q4_K_M", 4096)
    assert not measured.changed_from(measured)
    assert ServedModel("qwen3:8b", "def Q8_0", 4096).changed_from(measured)
    assert ServedModel("qwen3:8b", "abc Q4_K_M", 8192).changed_from(measured)
    assert ServedModel("llama3.2", "abc Q4_K_M", 4096).changed_from(measured)
    assert not ServedModel("qwen3:8b", None, None).changed_from(measured)
    assert ServedModel.from_dict(measured.as_dict()) == measured
    assert measured.describe() == "qwen3:8b [abc Q4_K_M], 4096"


async def test_a_record_that_holds_seeds_the_curve_after_a_restart(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """The measured curve is stored: after a reload the scheduler starts from it again."""
    entry = init_integration
    record = await _calibrated(hass, entry)
    assert record.measured_on == entry.runtime_data.server.served_model
    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    runtime = entry.runtime_data
    assert runtime.calibration.record == record
    assert [p.sequences for p in runtime.scheduler.batch_cost.points(0.0)] == [
        size for size, _ in record.curve
    ]
    issue = ir.async_get(hass).async_get_issue(DOMAIN, stale_issue_id(entry.entry_id))
    assert issue is None


@pytest.mark.parametrize(
    "change",
    [{"kv_capacity_tokens": 2 * 32768}, {"quantization": "Q8_0"}],
    ids=["context", "quantization"],
)
async def test_a_changed_server_makes_the_calibration_stale(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    sim: SimulatedServer,
    change: dict[str, object],
) -> None:
    """A bigger context or another quantization: curve and applied settings forgotten, repair.

    An applied option the user changed since is the user's and stays. The fix flow plans a
    re-calibration; it runs in the night's window and replaces the stale record.
    """
    entry = init_integration
    runtime = entry.runtime_data
    await _calibrated(hass, entry, **{OPT_MAX_SEQUENCES: 1, OPT_PREFILL_GUARD: 640})
    await async_set_options(hass, entry, **{OPT_PREFILL_GUARD: 900})
    assert runtime.scheduler.settings.max_sequences == 1

    await sim.restart(**change)
    await runtime.server.async_refresh()
    await hass.async_block_till_done()
    issue_id = stale_issue_id(entry.entry_id)
    issue = ir.async_get(hass).async_get_issue(DOMAIN, issue_id)
    assert issue is not None and issue.is_fixable
    assert issue.translation_key == "calibration_stale"
    assert issue.translation_placeholders is not None
    assert (
        issue.translation_placeholders["measured"]
        != (issue.translation_placeholders["now"])
    )
    assert runtime.scheduler.batch_cost.points(1e9) == []
    assert OPT_MAX_SEQUENCES not in entry.options
    assert entry.options[OPT_PREFILL_GUARD] == 900
    assert runtime.scheduler.settings.max_sequences == 2  # the server's slots again
    record = runtime.calibration.record
    assert record is not None and record.stale
    stored = Calibration(hass, entry.entry_id)
    await hass.async_block_till_done()
    await stored.async_load()
    assert stored.record is not None and stored.record.stale

    # The next poll changes nothing more (the curve learned since is kept).
    runtime.scheduler.batch_cost.seed(1, 0.01)
    await runtime.server.async_refresh()
    await hass.async_block_till_done()
    assert runtime.scheduler.batch_cost.points(2e9) != []

    assert await async_setup_component(hass, REPAIRS_DOMAIN, {})
    manager = hass.data[REPAIRS_DOMAIN]["flow_manager"]
    result = await manager.async_init(DOMAIN, data={"issue_id": issue_id})
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "confirm"
    result = await manager.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert runtime.calibration.planned
    assert ir.async_get(hass).async_get_issue(DOMAIN, issue_id) is None

    # Outside the window nothing runs; with the window open (start = end: always) it does.
    nightly = runtime.recalibration
    nightly.duration_s = 1
    assert not nightly.may_start(dt_util.now().replace(hour=14))
    await async_set_options(
        hass, entry, **{OPT_NIGHTLY_START: "00:00:00", OPT_NIGHTLY_END: "00:00:00"}
    )
    async_fire_time_changed(hass, dt_util.utcnow() + CHECK_INTERVAL)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert not runtime.calibration.planned
    record = runtime.calibration.record
    assert record is not None and not record.stale
    assert record.measured_on == runtime.server.served_model
    assert entry.data[CONF_URL] == sim.url
