"""Repair issues of a server: unreachable for minutes, configured model gone, slots too small.

And one of the household's pool: every server of a lane down (``household`` raises and clears it).

The issue of a calibration that no longer holds is raised by ``calibration``; its fix flow, which
plans a new one for the night, is here with the others.
"""

from __future__ import annotations

from typing import Any

from homeassistant.components.repairs import RepairsFlow, RepairsFlowResult
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_URL
from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers.event import async_call_later
import probatio

from custom_components.llm_lanes.calibration import stale_issue_id
from custom_components.llm_lanes.const import (
    CONF_MODEL,
    DOMAIN,
    UNREACHABLE_REPAIR_AFTER,
)
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry, PollCoordinator
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.slot_context import (
    MIN_CONTEXT_PER_SLOT,
    RECOMMENDED_CONTEXT_PER_SLOT,
    is_small,
)


def unreachable_issue_id(entry_id: str) -> str:
    """Issue id of "server unreachable" for one entry."""
    return f"server_unreachable_{entry_id}"


def model_missing_issue_id(entry_id: str) -> str:
    """Issue id of "configured model missing" for one entry."""
    return f"model_missing_{entry_id}"


def small_context_issue_id(entry_id: str) -> str:
    """Issue id of "slots too small for Assist" for one entry."""
    return f"small_context_{entry_id}"


@callback
def _async_raise_issue(
    hass: HomeAssistant,
    issue_id: str,
    translation_key: str,
    placeholders: dict[str, str],
    fix_data: dict[str, str | int | float | None] | None = None,
    *,
    severity: ir.IssueSeverity = ir.IssueSeverity.ERROR,
) -> None:
    """Raise an issue; with ``fix_data`` it is fixable (``async_create_fix_flow``)."""
    ir.async_create_issue(
        hass,
        DOMAIN,
        issue_id,
        is_fixable=fix_data is not None,
        severity=severity,
        translation_key=translation_key,
        translation_placeholders=placeholders,
        data=fix_data,
    )


@callback
def async_track_server_issues(hass: HomeAssistant, entry: LLMLanesConfigEntry) -> None:
    """Raise and clear the entry's issues from the server coordinator's polls."""
    server = entry.runtime_data.server
    unsub_timer: CALLBACK_TYPE | None = None

    @callback
    def _cancel_timer() -> None:
        nonlocal unsub_timer
        if unsub_timer is not None:
            unsub_timer()
            unsub_timer = None

    @callback
    def _still_unreachable(_now: Any) -> None:
        nonlocal unsub_timer
        unsub_timer = None
        # A server the household put (or found) asleep is not out: it is woken for its work.
        if not server.last_update_success and not entry.runtime_data.sleeps():
            _async_raise_issue(
                hass,
                unreachable_issue_id(entry.entry_id),
                "server_unreachable",
                {"title": entry.title, "url": entry.data[CONF_URL]},
            )

    @callback
    def _polled() -> None:
        nonlocal unsub_timer
        if not server.last_update_success:
            if unsub_timer is None:
                unsub_timer = async_call_later(
                    hass, UNREACHABLE_REPAIR_AFTER, _still_unreachable
                )
            return
        _cancel_timer()
        ir.async_delete_issue(hass, DOMAIN, unreachable_issue_id(entry.entry_id))
        info = server.data.info
        model = entry.data[CONF_MODEL]
        if info.models and model not in info.models:
            _async_raise_issue(
                hass,
                model_missing_issue_id(entry.entry_id),
                "model_missing",
                {"title": entry.title, "model": model},
                fix_data={"entry_id": entry.entry_id},
            )
        else:
            ir.async_delete_issue(hass, DOMAIN, model_missing_issue_id(entry.entry_id))
        _async_check_context(hass, entry, server)

    entry.async_on_unload(server.async_add_listener(_polled))
    entry.async_on_unload(_cancel_timer)
    _polled()


def pool_lane_issue_id(lane: Lane) -> str:
    """Issue id of "every server of a lane is down" (the household's, not one entry's)."""
    return f"pool_lane_down_{lane.key}"


@callback
def async_raise_pool_lane_issue(
    hass: HomeAssistant, lane: Lane, servers: list[str]
) -> None:
    """Say that no server of the pool can serve ``lane`` now, naming its servers."""
    _async_raise_issue(
        hass,
        pool_lane_issue_id(lane),
        "pool_lane_down",
        {"lane": lane.key, "servers": ", ".join(servers)},
    )


@callback
def async_clear_pool_lane_issue(hass: HomeAssistant, lane: Lane) -> None:
    """Clear the lane's issue: a server of it is back."""
    ir.async_delete_issue(hass, DOMAIN, pool_lane_issue_id(lane))


def small_context_placeholders(
    title: str, context_per_slot: int, slots: int | None
) -> dict[str, str]:
    """Return what the small-context warnings say: the context found and what to set instead.

    ``ctx_size`` is llama.cpp's ``--ctx-size`` for its slots at the recommended size,
    ``parallel`` the slots the same memory holds at the minimum size.
    """
    slots = slots or 1
    return {
        "title": title,
        "context": str(context_per_slot),
        "slots": str(slots),
        "minimum": str(MIN_CONTEXT_PER_SLOT),
        "recommended": str(RECOMMENDED_CONTEXT_PER_SLOT),
        "ctx_size": str(slots * RECOMMENDED_CONTEXT_PER_SLOT),
        "parallel": str(max(1, context_per_slot * slots // MIN_CONTEXT_PER_SLOT)),
    }


@callback
def _async_check_context(
    hass: HomeAssistant, entry: LLMLanesConfigEntry, server: PollCoordinator
) -> None:
    """Warn while the server's slots are too small for Assist; clear once it reports enough.

    The advice is the one for the server's kind (where its owner sets the context). A server that
    says nothing of its context now (Ollama with the model unloaded) leaves the issue as it is.
    """
    issue_id = small_context_issue_id(entry.entry_id)
    context = server.context_per_slot
    if context is None:
        return
    if not is_small(context):
        ir.async_delete_issue(hass, DOMAIN, issue_id)
        return
    _async_raise_issue(
        hass,
        issue_id,
        f"small_context_{server.backend.profile.context_setting}",
        small_context_placeholders(entry.title, context, server.slots),
        severity=ir.IssueSeverity.WARNING,
    )


class ModelMissingRepairFlow(RepairsFlow):
    """Pick another model the server offers, then reload the entry."""

    def __init__(self, entry_id: str) -> None:
        """Remember which entry to fix."""
        self.entry_id = entry_id

    async def async_step_init(
        self, user_input: dict[str, str] | None = None
    ) -> RepairsFlowResult:
        """Start with the model choice (``user_input`` here is the issue's data)."""
        return await self.async_step_pick_model()

    async def async_step_pick_model(
        self, user_input: dict[str, str] | None = None
    ) -> RepairsFlowResult:
        """Offer the server's models."""
        entry: LLMLanesConfigEntry | None = self.hass.config_entries.async_get_entry(
            self.entry_id
        )
        if entry is None or entry.state is not ConfigEntryState.LOADED:
            return self.async_abort(reason="entry_not_loaded")
        models = entry.runtime_data.server.data.info.models
        if user_input is not None:
            # The entry's update listener reloads it with the new model.
            self.hass.config_entries.async_update_entry(
                entry, data={**entry.data, CONF_MODEL: user_input[CONF_MODEL]}
            )
            return self.async_create_entry(data={})
        return self.async_show_form(
            step_id="pick_model",
            data_schema=probatio.Schema(
                {probatio.Required(CONF_MODEL): probatio.In(models)}
            ),
            description_placeholders={"model": entry.data[CONF_MODEL]},
        )


class RecalibrateRepairFlow(RepairsFlow):
    """Plan a new calibration for the night's job window (``jobs.recalibration`` runs it)."""

    def __init__(self, entry_id: str) -> None:
        """Remember which entry to calibrate."""
        self.entry_id = entry_id

    async def async_step_init(
        self, user_input: dict[str, str] | None = None
    ) -> RepairsFlowResult:
        """Start with the confirmation (``user_input`` here is the issue's data)."""
        return await self.async_step_confirm()

    async def async_step_confirm(
        self, user_input: dict[str, str] | None = None
    ) -> RepairsFlowResult:
        """Say when it runs; plan it once confirmed."""
        entry: LLMLanesConfigEntry | None = self.hass.config_entries.async_get_entry(
            self.entry_id
        )
        if entry is None or entry.state is not ConfigEntryState.LOADED:
            return self.async_abort(reason="entry_not_loaded")
        runtime = entry.runtime_data
        if user_input is not None:
            runtime.calibration.planned = True
            await runtime.calibration.async_save()
            return self.async_create_entry(data={})
        jobs = runtime.jobs.settings
        return self.async_show_form(
            step_id="confirm",
            description_placeholders={
                "title": entry.title,
                "start": jobs.window_start.strftime("%H:%M"),
                "end": jobs.window_end.strftime("%H:%M"),
            },
        )


async def async_create_fix_flow(
    hass: HomeAssistant, issue_id: str, data: dict[str, Any] | None
) -> RepairsFlow:
    """Create the fix flow of a fixable issue: "model missing" or "calibration stale"."""
    assert data is not None
    entry_id = str(data["entry_id"])
    if issue_id == stale_issue_id(entry_id):
        return RecalibrateRepairFlow(entry_id)
    return ModelMissingRepairFlow(entry_id)
