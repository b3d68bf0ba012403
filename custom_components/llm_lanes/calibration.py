"""What ``llm_lanes.run_benchmark`` measured and applied on one server, and when it goes stale.

``async_calibrate`` is the action's engine (the night's re-calibration runs it too): it runs the
calibration (``core.bench.calibrate``), seeds the scheduler's learned batch curve with the
measured one, keeps the curve's plot (served by ``curve_view``), applies the recommendation when
asked and the decision allows it, and records what it measured on and what it applied
(``Calibration``: one store document per entry, kept across restarts).

What was measured holds for one model file at one context (``ServedModel``). When a poll finds
the server running something else (another model, another quantization, another context size),
``async_track_calibration`` forgets the learned curve; when a calibration is on record, the
settings it applied that are still in place go back to their defaults, and a repair says so and
offers a re-calibration in the night's job window (``jobs.recalibration``). A record that still
holds seeds the curve again after a restart.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from homeassistant.components.http.auth import async_sign_path
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import issue_registry as ir
from homeassistant.util import dt as dt_util

from custom_components.llm_lanes.calibration_record import CalibrationRecord
from custom_components.llm_lanes.const import (
    CONF_MODEL,
    DOMAIN,
    LOGGER,
    OPT_HEADROOM,
    OPT_MAX_SEQUENCES,
    OPT_PREFILL_BUDGET,
    OPT_PREFILL_GUARD,
)
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.bench.calibrate import (
    CalibrationProgress,
    calibrate,
)
from custom_components.llm_lanes.core.bench.curve import svg_plot
from custom_components.llm_lanes.core.bench.workload import Scenario, load_scenario
from custom_components.llm_lanes.error_translation import translated_errors
from custom_components.llm_lanes.served_model import ServedModel

APPLIED_SETTINGS: Final = {
    OPT_MAX_SEQUENCES: int,
    OPT_PREFILL_BUDGET: int,
    OPT_HEADROOM: int,
    OPT_PREFILL_GUARD: int,
}
"""Calibrated settings that ``apply`` writes into the entry's options."""
EVENT_BENCHMARK_PROGRESS: Final = f"{DOMAIN}_benchmark_progress"
"""Fired as ``run_benchmark`` goes: before the batch curve, after each setting, at the end."""
PLOT_URL_VALID_FOR: Final = timedelta(days=1)
"""How long the signed ``curve_plot_url`` opens without Home Assistant's login."""


def curve_plot_path(entry_id: str) -> str:
    """Where Home Assistant serves the entry's batch-curve chart (``curve_view``)."""
    return f"/api/{DOMAIN}/curve/{entry_id}.svg"


def stale_issue_id(entry_id: str) -> str:
    """Issue id of "the calibration no longer holds" for one entry."""
    return f"calibration_stale_{entry_id}"


async def async_calibrate(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    *,
    scenario: str | Scenario,
    duration_s: float,
    apply: bool,
) -> dict[str, Any]:
    """Calibrate the entry's server; with ``apply``, apply the pick if the decision allows it.

    Returns the action's response: the calibration's (``CalibrationResult.as_response``), the
    chart's signed URL and what was applied (empty when not asked, or when the run was too short
    or the pick no better than the current settings: ``verdict_reason`` says which). Its
    progress goes out as ``EVENT_BENCHMARK_PROGRESS`` events (``async_report_progress``).
    """
    runtime = entry.runtime_data
    loaded = (
        scenario
        if isinstance(scenario, Scenario)
        else await hass.async_add_executor_job(load_scenario, scenario)
    )
    measured_on = runtime.server.served_model or ServedModel(entry.data[CONF_MODEL])
    with translated_errors():
        result = await calibrate(
            runtime.backend,
            runtime.scheduler.settings,
            scenario=loaded,
            duration_s=duration_s,
            model=entry.data[CONF_MODEL],
            on_progress=progress_reporter(hass, entry),
        )
    response: dict[str, Any] = result.as_response()
    record = CalibrationRecord(
        measured_on=measured_on, measured_at=dt_util.utcnow().isoformat()
    )
    if result.curve is not None:
        record.curve = [
            (point.sequences, point.itl_p50_s)
            for point in result.curve.points
            if point.itl_p50_s is not None
        ]
        for sequences, itl_s in record.curve:
            runtime.scheduler.batch_cost.seed(sequences, itl_s)
        record.plot = svg_plot(result.curve)
        response["curve_plot_url"] = async_sign_path(
            hass, curve_plot_path(entry.entry_id), PLOT_URL_VALID_FOR
        )
    calibration = runtime.calibration
    applied: dict[str, int] = {}
    if apply and result.decision.applies:
        applied = {
            key: convert(result.recommended_values[key])
            for key, convert in APPLIED_SETTINGS.items()
            if key in result.recommended_values
        }
        hass.config_entries.async_update_entry(
            entry, options={**entry.options, **applied}
        )
        record.applied = applied
    elif (before := calibration.record) is not None and not before.stale:
        # What an earlier run applied on this same server is still what holds.
        record.applied = before.applied
    response["applied"] = applied
    calibration.record = record
    calibration.planned = False
    await calibration.async_save()
    ir.async_delete_issue(hass, DOMAIN, stale_issue_id(entry.entry_id))
    return response


def progress_reporter(
    hass: HomeAssistant, entry: LLMLanesConfigEntry
) -> Callable[[CalibrationProgress], None]:
    """Return what tells the household where the entry's calibration is (an event, a log line).

    The first (``batch_curve``) says how long the settings will take at most once the batch
    curve is measured, the second (``sweep``) how long the curve took; then one per setting
    done, and one at the end.
    """

    def report(progress: CalibrationProgress) -> None:
        if progress.step == "batch_curve":
            LOGGER.info(
                "run_benchmark on %s: the batch curve, then %d settings in %.0f s at most",
                entry.title,
                progress.settings_total,
                progress.remaining_s,
            )
        elif progress.step == "sweep":
            LOGGER.info(
                "run_benchmark on %s: batch curve measured in %.0f s; %d settings, "
                "%.0f s at most",
                entry.title,
                progress.elapsed_s,
                progress.settings_total,
                progress.remaining_s,
            )
        hass.bus.async_fire(
            EVENT_BENCHMARK_PROGRESS,
            {
                "entry_id": entry.entry_id,
                "step": progress.step,
                "settings_done": progress.settings_done,
                "settings_total": progress.settings_total,
                "setting": progress.setting,
                "elapsed_s": round(progress.elapsed_s, 1),
                "remaining_s": round(progress.remaining_s),
            },
        )

    return report


@callback
def async_track_calibration(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> None:
    """Follow the server's polls: what the learned curve and the calibration on record hold for.

    At the first poll a record that still holds seeds the curve again. From then on, another
    model, variant or context than at the poll before forgets the learned curve, and one other
    than the record's makes the record stale (``_async_mark_stale``).
    """
    runtime = entry.runtime_data
    server = runtime.server
    last_seen: ServedModel | None = None

    @callback
    def polled() -> None:
        nonlocal last_seen
        served = server.served_model
        if served is None:
            return
        previous, last_seen = last_seen, served
        record = runtime.calibration.record
        holds = record is not None and not record.stale
        if record is not None and holds and record.measured_on.changed_from(served):
            _async_mark_stale(hass, entry, record, served)
        elif previous is None and record is not None and holds:
            for sequences, itl_s in record.curve:
                runtime.scheduler.batch_cost.seed(sequences, itl_s)
        elif previous is not None and served.changed_from(previous):
            LOGGER.info(
                "%s now runs %s (was %s): the learned batch curve starts again",
                entry.title,
                served.describe(),
                previous.describe(),
            )
            runtime.scheduler.batch_cost.forget()

    entry.async_on_unload(server.async_add_listener(polled))
    polled()


@callback
def _async_mark_stale(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    record: CalibrationRecord,
    served: ServedModel,
) -> None:
    """Forget what the calibration measured; raise the repair that offers a new one.

    The learned curve goes, and so do the options it applied that still hold its values (those
    the user changed since are the user's).
    """
    runtime = entry.runtime_data
    LOGGER.info(
        "%s now runs %s; run_benchmark measured %s: its curve and settings are forgotten",
        entry.title,
        served.describe(),
        record.measured_on.describe(),
    )
    runtime.scheduler.batch_cost.forget()
    record.stale = True
    options = {
        key: value
        for key, value in entry.options.items()
        if record.applied.get(key, object()) != value
    }
    if options != dict(entry.options):
        hass.config_entries.async_update_entry(entry, options=options)
    calibration = runtime.calibration
    entry.async_create_background_task(
        hass, calibration.async_save(), f"{DOMAIN} calibration {entry.title}"
    )
    jobs = runtime.jobs.settings
    ir.async_create_issue(
        hass,
        DOMAIN,
        stale_issue_id(entry.entry_id),
        is_fixable=True,
        severity=ir.IssueSeverity.WARNING,
        translation_key="calibration_stale",
        translation_placeholders={
            "title": entry.title,
            "measured": record.measured_on.describe(),
            "now": served.describe(),
            "start": jobs.window_start.strftime("%H:%M"),
            "end": jobs.window_end.strftime("%H:%M"),
        },
        data={"entry_id": entry.entry_id},
    )
