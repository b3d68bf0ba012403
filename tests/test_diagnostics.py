"""Diagnostics: settings, server and scheduler state; no API key, no prompt text."""

from __future__ import annotations

import json

from homeassistant.const import CONF_API_KEY
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.components.diagnostics import (
    get_diagnostics_for_config_entry,
)
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator
from syrupy.assertion import SnapshotAssertion
from syrupy.matchers import path_type

from custom_components.llm_lanes.const import CONF_PROMPT
from custom_components.llm_lanes.diagnostics import async_get_config_entry_diagnostics

from .support.entities import async_call_entity_action
from .support.requests import async_call_action


async def test_diagnostics_redact_secrets_and_prompts(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """The API key and the agents' instructions are redacted; prompts never appear."""
    entry = init_integration
    hass.config_entries.async_update_entry(
        entry, data={**entry.data, CONF_API_KEY: "sk-secret"}
    )
    subentry = next(iter(entry.subentries.values()))
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, CONF_PROMPT: "You are a secret butler"}
    )
    await hass.async_block_till_done()
    for action, data in (
        ("generate", {"prompt": "my private question"}),
        ("summarize", {"text": "my private diary"}),
    ):
        await async_call_action(hass, action, config_entry_id=entry.entry_id, **data)
    diagnostics = await async_get_config_entry_diagnostics(hass, entry)
    text = json.dumps(diagnostics)
    assert "sk-secret" not in text
    assert "secret butler" not in text
    assert "private question" not in text
    assert "private diary" not in text
    [job] = diagnostics["jobs"]
    assert job["status"] in {"queued", "running", "done"}
    assert diagnostics["entry"]["data"][CONF_API_KEY] == "**REDACTED**"
    assert diagnostics["server"]["last_update_success"] is True
    assert diagnostics["server"]["state"]["info"]["kind"] == "llama_cpp"
    lanes = diagnostics["scheduler"]["lanes"]
    assert lanes["automation"]["finished_total"] == 1
    assert diagnostics["scheduler"]["settings"]["policy"] == "lanes"


@pytest.mark.freeze_time("2026-11-30 02:00:00-08:00")
async def test_diagnostics_snapshot(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    init_integration: MockConfigEntry,
    snapshot: SnapshotAssertion,
) -> None:
    """What the download holds for an idle server with one job waiting (jobs are paused).

    At 02:00 in Home Assistant's test time zone, inside the nightly window, so that the job waits
    because jobs are paused whatever the hour the test runs at. The server's URL and unique id (its
    port), the job's id and the snapshot's clock change every run: they are checked by type only.
    """
    await async_call_entity_action(
        hass, init_integration, "switch", "jobs_paused", "turn_on"
    )
    await async_call_action(
        hass, "summarize", name="digest", text="The door opened twice."
    )
    diagnostics = await get_diagnostics_for_config_entry(
        hass, hass_client, init_integration
    )
    assert diagnostics == snapshot(
        matcher=path_type(
            {r".*\.(url|unique_id|id)": (str,), r".*\.taken_at": (float,)}, regex=True
        )
    )
