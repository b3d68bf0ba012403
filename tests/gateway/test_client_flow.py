"""Client subentries: added and reconfigured in the UI, the key shown once, no reload.

A client is stored as its form is submitted and its key shown in the result, with the base URLs
Home Assistant is reached at (so closing the dialog loses nothing); those URLs work.

Also what the rest of the integration shows of clients: their requester's name, their quota in
the scheduler settings, diagnostics that list them without their key, their token sensor (gone
with the client); and that one client's key is revoked without touching the others.
"""

from __future__ import annotations

import json

from homeassistant import config_entries
from homeassistant.components.http import ApiConfig
from homeassistant.const import CONF_API_KEY, CONF_NAME
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.components.diagnostics import (
    get_diagnostics_for_config_entry,
)
from pytest_homeassistant_custom_component.typing import (
    ClientSessionGenerator,
    WebSocketGenerator,
)
from yarl import URL

from custom_components.llm_lanes.const import (
    CONF_LANE,
    CONF_MAX_OUTPUT_TOKENS,
    CONF_QUOTA_TOKENS_PER_DAY,
    CONF_ROTATE_KEY,
    SUBENTRY_CLIENT,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.requesters import (
    async_requester_name,
    client_requester,
)
from tests.support.entities import async_flush_snapshots, entity_id_for
from tests.support.entries import FAST_SIM, MODEL
from tests.support.requests import finished_requests

from .conftest import Gateway
from .samples import HELLO

# Flows do not depend on the server kind: one simulated llama.cpp.
pytestmark = pytest.mark.parametrize("sim_config", [FAST_SIM], ids=["llama_cpp"])


async def _add_client_in_the_ui(
    hass: HomeAssistant, entry: MockConfigEntry, **fields: object
) -> tuple[str, dict[str, str]]:
    """Go through the add-client flow; return the new subentry's id and what its result shows."""
    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, SUBENTRY_CLIENT),
        context={"source": config_entries.SOURCE_USER},
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "user"
    before = set(entry.subentries)
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_NAME: "Open WebUI", CONF_LANE: "interactive", **fields}
    )
    # Stored at once: the key is shown in the result, nothing is left to submit.
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["description"] == "key"
    shown = dict(result["description_placeholders"] or {})
    await hass.async_block_till_done()
    (subentry_id,) = set(entry.subentries) - before
    return subentry_id, shown


async def test_add_client_shows_its_key_once_and_needs_no_reload(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """The key is shown with both base URLs, stored, and works at once; the entry keeps running."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    subentry_id, shown = await _add_client_in_the_ui(
        hass, entry, **{CONF_QUOTA_TOKENS_PER_DAY: 5000, CONF_MAX_OUTPUT_TOKENS: 3}
    )
    subentry = entry.subentries[subentry_id]
    key = subentry.data[CONF_API_KEY]
    assert shown["api_key"] == key
    assert len(key) >= 40
    assert shown["openai_url"].endswith("/api/llm_lanes/v1")
    assert shown["ollama_url"].endswith(f"/api/llm_lanes/ollama/{key}")
    assert dict(subentry.data) == {
        CONF_LANE: "interactive",
        CONF_QUOTA_TOKENS_PER_DAY: 5000,
        CONF_MAX_OUTPUT_TOKENS: 3,
        CONF_API_KEY: key,
    }
    # No reload: the same scheduler, with the client's quota.
    assert entry.runtime_data.scheduler is scheduler
    requester = client_requester(subentry_id)
    assert scheduler.settings.requester_quotas[requester] == 5000
    assert await async_requester_name(hass, requester) == "Open WebUI"

    finished = finished_requests(entry)
    answer = await gateway.openai(key).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=50
    )
    assert answer.usage is not None and answer.usage.completion_tokens <= 3  # capped
    assert [(f.lane, f.requester) for f in finished] == [(Lane.INTERACTIVE, requester)]

    hass.config_entries.async_remove_subentry(entry, subentry_id)
    await hass.async_block_till_done()
    assert entry.runtime_data.scheduler is scheduler
    assert requester not in scheduler.settings.requester_quotas
    with pytest.raises(openai.AuthenticationError):
        await gateway.openai(key).models.list()


async def test_the_shown_url_is_where_home_assistant_listens(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """Bound to 127.0.0.1 with a LAN address detected (``scripts/develop``): 127.0.0.1 is shown.

    The real ``openai`` client, given only what the dialog shows, gets an answer.
    """
    port = URL(gateway.url).port
    assert port is not None
    hass.config.api = ApiConfig(
        local_ip="192.0.2.2", host="127.0.0.1", port=port, use_ssl=False
    )
    _, shown = await _add_client_in_the_ui(hass, init_integration)
    assert shown["openai_url"] == f"http://127.0.0.1:{port}/api/llm_lanes/v1"
    client = openai.AsyncOpenAI(
        base_url=shown["openai_url"], api_key=shown["api_key"], max_retries=0
    )
    try:
        answer = await client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=3
        )
    finally:
        await client.close()
    assert answer.choices[0].message.content


async def test_reconfigure_changes_lane_and_rotates_the_key(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """A new lane applies at once; a rotated key is shown once and the old one stops working."""
    entry = init_integration
    subentry_id, shown = await _add_client_in_the_ui(hass, entry)
    old_key = shown["api_key"]

    result = await entry.start_subentry_reconfigure_flow(hass, subentry_id)
    assert result["step_id"] == "reconfigure"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_LANE: "voice", CONF_ROTATE_KEY: False}
    )
    assert result["type"] is FlowResultType.ABORT
    assert entry.subentries[subentry_id].data[CONF_API_KEY] == old_key
    finished = finished_requests(entry)
    await gateway.openai(old_key).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2
    )
    assert [f.lane for f in finished] == [Lane.VOICE]

    result = await entry.start_subentry_reconfigure_flow(hass, subentry_id)
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_LANE: "voice", CONF_ROTATE_KEY: True}
    )
    # Stored as the form is submitted; the closing message shows the new key.
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "key_rotated"
    shown = dict(result["description_placeholders"] or {})
    new_key = shown["api_key"]
    assert new_key != old_key
    assert shown["ollama_url"].endswith(f"/api/llm_lanes/ollama/{new_key}")
    await hass.async_block_till_done()
    assert entry.subentries[subentry_id].data[CONF_API_KEY] == new_key

    with pytest.raises(openai.AuthenticationError):
        await gateway.openai(old_key).models.list()
    assert [m.id async for m in await gateway.openai(new_key).models.list()] == [MODEL]


async def test_diagnostics_list_clients_without_keys(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
    hass_client: ClientSessionGenerator,
) -> None:
    """Diagnostics show each client's lane, limits and counters; its key nowhere."""
    client = await gateway.add_client(
        init_integration, name="Phone", lane="voice", **{CONF_QUOTA_TOKENS_PER_DAY: 100}
    )
    await gateway.openai(client.api_key).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2
    )
    diagnostics = await get_diagnostics_for_config_entry(
        hass, hass_client, init_integration
    )
    (phone,) = diagnostics["clients"]
    assert phone["name"] == "Phone"
    assert phone["lane"] == "voice"
    assert phone["quota_tokens_per_day"] == 100
    assert phone["finished_total"] == 1
    assert phone["tokens_last_24h"] > 0
    assert client.api_key not in json.dumps(diagnostics)
    (subentry,) = [
        s for s in diagnostics["entry"]["subentries"] if s["type"] == "client"
    ]
    assert subentry["data"][CONF_API_KEY] == "**REDACTED**"


async def _dashboard_token_sensors(hass_ws_client: WebSocketGenerator) -> list[str]:
    """Return the entities the dashboard's "Total tokens" card lists."""
    client = await hass_ws_client()
    await client.send_json_auto_id({"type": "llm_lanes/dashboard"})
    response = await client.receive_json()
    assert response["success"], response
    (view,) = response["result"]["views"]
    (section,) = (
        section
        for section in view["sections"]
        if section["cards"][0]["heading"] == "Tokens per requester"
    )
    totals = next(card for card in section["cards"] if card["type"] == "entities")
    return [row["entity"] for row in totals["entities"]]


async def test_deleting_a_client_deletes_its_token_sensor(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
    hass_ws_client: WebSocketGenerator,
) -> None:
    """Its sensor leaves the registry, the states and the dashboard's totals; others stay."""
    entry = init_integration
    kept = await gateway.add_client(entry, name="Phone")
    deleted = await gateway.add_client(entry, name="Open WebUI")
    for client in (kept, deleted):
        await gateway.openai(client.api_key).chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=2
        )
    await async_flush_snapshots(hass)
    sensors = {
        client: entity_id_for(
            hass, entry, "sensor", f"requester_tokens_{client.requester}"
        )
        for client in (kept, deleted)
    }
    assert set(sensors.values()) <= set(await _dashboard_token_sensors(hass_ws_client))

    hass.config_entries.async_remove_subentry(entry, deleted.subentry_id)
    await hass.async_block_till_done()

    registry = er.async_get(hass)
    assert registry.async_get(sensors[deleted]) is None
    assert hass.states.get(sensors[deleted]) is None
    assert registry.async_get(sensors[kept]) is not None
    totals = await _dashboard_token_sensors(hass_ws_client)
    assert sensors[kept] in totals
    assert sensors[deleted] not in totals
    # The scheduler still counts what the client used: no sensor comes back for it.
    await async_flush_snapshots(hass)
    assert registry.async_get(sensors[deleted]) is None


async def test_a_client_deleted_while_the_server_is_unloaded_loses_its_sensor(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """Deleted while nothing listens (the entry unloaded): the set-up removes the sensor."""
    entry = init_integration
    client = await gateway.add_client(entry)
    await gateway.openai(client.api_key).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2
    )
    await async_flush_snapshots(hass)
    sensor = entity_id_for(
        hass, entry, "sensor", f"requester_tokens_{client.requester}"
    )
    assert await hass.config_entries.async_unload(entry.entry_id)
    hass.config_entries.async_remove_subentry(entry, client.subentry_id)
    await hass.async_block_till_done()
    assert er.async_get(hass).async_get(sensor) is not None  # nothing removed it yet

    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert er.async_get(hass).async_get(sensor) is None


async def test_rotating_one_clients_key_leaves_the_others_working(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """One app's key is revoked by rotating it; every other client keeps its key and works."""
    entry = init_integration
    revoked_id, shown = await _add_client_in_the_ui(hass, entry)
    others = [
        await gateway.add_client(entry, name="Phone"),
        await gateway.add_client(entry, name="Home Assistant Ollama", lane="voice"),
    ]
    scheduler = entry.runtime_data.scheduler

    result = await entry.start_subentry_reconfigure_flow(hass, revoked_id)
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_LANE: "interactive", CONF_ROTATE_KEY: True}
    )
    assert result["reason"] == "key_rotated"
    await hass.async_block_till_done()

    with pytest.raises(openai.AuthenticationError):
        await gateway.openai(shown["api_key"]).models.list()
    finished = finished_requests(entry)
    for other in others:
        assert entry.subentries[other.subentry_id].data[CONF_API_KEY] == other.api_key
        await gateway.openai(other.api_key).chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=2
        )
        await gateway.ollama(other.api_key).chat(model=MODEL, messages=HELLO)
    assert sorted(f.requester for f in finished) == sorted(
        [other.requester for other in others] * 2
    )
    assert entry.runtime_data.scheduler is scheduler  # nothing was reloaded
