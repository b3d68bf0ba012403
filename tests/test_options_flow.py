"""The options flow: every scheduler setting offered, stored and applied live; the quota picker."""

from __future__ import annotations

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import ATTR_FRIENDLY_NAME
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import config_validation as cv
import probatio
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.settings_options import DEFAULT_SLOTS
from tools.simulator.server import SimulatedServer

from .support.entities import async_flush_snapshots, async_set_options
from .support.entries import async_set_up
from .support.requests import async_generate


async def test_options_flow(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Every scheduler setting is offered; the result is stored and applied without reload."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    result = await hass.config_entries.options.async_init(entry.entry_id)
    assert result["type"] is FlowResultType.FORM
    schema_keys = {str(key) for key in result["data_schema"].schema}
    assert {
        "max_sequences",
        "prefill_budget",
        "headroom",
        "aging_s",
        "background_share",
        "preemption",
        "prefill_guard_tokens",
        "background_with_voice",
        "background_paused",
        "quota_tokens_per_day",
        "requester_quotas",
        "quota_action",
        "policy",
        "nightly_start",
        "nightly_end",
        "voice",
        "interactive",
        "automation",
        "background",
    } <= schema_keys

    user_input = {
        "policy": "fifo",
        "max_sequences": 3,
        "prefill_budget": 2048,
        "headroom": 3,
        "aging_s": 20,
        "background_share": 20,
        "preemption": False,
        "prefill_guard_tokens": 256,
        "background_with_voice": 1,
        "background_paused": True,
        "quota_tokens_per_day": 1000,
        "requester_quotas": [{"requester": "user:abc", "tokens": 500}],
        "quota_action": "reject",
        "nightly_start": "02:00:00",
        "nightly_end": "05:00:00",
        "voice": {
            "ttft_slo_s": 0.4,
            "itl_slo_s": 0.08,
            "max_output_tokens": 300,
            "max_queued": 5,
        },
    }
    # Headroom must leave automations a slot: the form says so and nothing is stored.
    result = await hass.config_entries.options.async_configure(
        result["flow_id"], user_input
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"headroom": "headroom_not_below_max_sequences"}
    assert "max_sequences" not in entry.options
    # What the user sent stays in the form (the share in percent).
    shown = {str(key): key for key in result["data_schema"].schema}
    assert shown["headroom"].default() == 3
    assert shown["background_share"].default() == 20

    user_input["headroom"] = 1
    user_input["requester_quotas"] = [{"requester": "Alice's phone", "tokens": 500}]
    result = await hass.config_entries.options.async_configure(
        result["flow_id"], user_input
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"requester_quotas": "invalid_quotas"}

    user_input["requester_quotas"] = [
        {"requester": "user:abc", "tokens": 500},
        {"requester": "job:digest", "tokens": 2000.0},
    ]
    result = await hass.config_entries.options.async_configure(
        result["flow_id"], user_input
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert entry.options["max_sequences"] == 3
    assert entry.options["voice"]["max_queued"] == 5
    # Stored as the scheduler and the number entity use them.
    assert entry.options["background_share"] == 0.2
    assert entry.options["requester_quotas"] == "user:abc=500\njob:digest=2000"
    assert entry.runtime_data.scheduler is scheduler  # applied live, no reload
    settings = scheduler.settings
    assert settings.max_sequences == 3
    assert settings.headroom == 1
    assert settings.policy.value == "fifo"
    assert settings.background_paused is True
    assert settings.background_share == 0.2
    assert settings.requester_quotas == {"user:abc": 500, "job:digest": 2000}
    assert settings.prefill_guard_tokens == 256
    assert settings.background_with_voice == 1
    assert settings.lanes[Lane.VOICE].ttft_slo_s == 0.4

    # Opened again, the form shows the share in percent and the quotas as rows.
    result = await hass.config_entries.options.async_init(entry.entry_id)
    shown = {str(key): key for key in result["data_schema"].schema}
    assert shown["background_share"].default() == 20
    assert shown["requester_quotas"].description["suggested_value"] == [
        {"requester": "user:abc", "tokens": 500},
        {"requester": "job:digest", "tokens": 2000},
    ]
    # Removing every row removes every quota.
    del user_input["requester_quotas"]
    result = await hass.config_entries.options.async_configure(
        result["flow_id"], user_input
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert scheduler.settings.requester_quotas == {}


async def test_quota_picker_offers_known_requesters_by_name(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """People, the requesters the server charged and those with a quota, by their names."""
    entry = init_integration
    alice = await hass.auth.async_create_user("Alice")
    hass.states.async_set(
        "automation.morning", "on", {ATTR_FRIENDLY_NAME: "Morning briefing"}
    )
    await async_generate(entry, requester="automation:automation.morning")
    await async_generate(entry, requester="job:nightly_digest")
    await async_set_options(hass, entry, requester_quotas="ai_task=100")
    await async_flush_snapshots(hass)

    result = await hass.config_entries.options.async_init(entry.entry_id)
    schema = result["data_schema"].schema
    quotas = next(
        selector for key, selector in schema.items() if key == "requester_quotas"
    )
    picker = quotas.config["fields"]["requester"]["selector"]
    offered = {option["value"]: option["label"] for option in picker.config["options"]}
    assert offered == {
        f"user:{alice.id}": "Alice (user)",
        "automation:automation.morning": "Morning briefing (automation)",
        "job:nightly_digest": "nightly_digest (job)",
        "ai_task": "AI Task",
    }
    # Someone else may still be typed in.
    assert picker.config["custom_value"] is True
    # What the frontend receives: an object selector whose rows hold the picker and an amount.
    fields = probatio.to_field_list(schema, custom_serializer=cv.custom_serializer)
    (field,) = [field for field in fields if field["name"] == "requester_quotas"]
    rows = field["selector"]["object"]
    assert rows["multiple"] is True
    assert rows["fields"]["requester"]["selector"]["select"]["options"][0] == {
        "value": "ai_task",
        "label": "AI Task",
    }
    assert rows["fields"]["tokens"]["selector"]["number"]["min"] == 0


@pytest.mark.usefixtures("ha_core")
async def test_options_while_the_server_is_down(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, sim: SimulatedServer
) -> None:
    """An entry waiting for its server takes options: the form assumes the default slot count."""
    await sim.stop()
    entry = await async_set_up(hass, mock_config_entry, loaded=False)
    assert entry.state is ConfigEntryState.SETUP_RETRY
    result = await hass.config_entries.options.async_init(entry.entry_id)
    assert result["type"] is FlowResultType.FORM
    form = {
        str(key): key.default()
        for key in result["data_schema"].schema
        if isinstance(key, probatio.Required)
    }
    # The server's slot count is unknown while it is down.
    assert form["max_sequences"] == DEFAULT_SLOTS
    result = await hass.config_entries.options.async_configure(
        result["flow_id"], {**form, "max_sequences": 3}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert entry.options["max_sequences"] == 3
