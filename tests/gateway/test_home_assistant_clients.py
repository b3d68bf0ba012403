"""Home Assistant's own LLM integrations as gateway clients: ``ollama`` and ``llama_cpp``.

Each is set up in the test harness against the gateway (Ollama's URL = the client's Ollama host
URL, llama.cpp's base URL = the OpenAI endpoint with the client key) and answers a conversation
turn; LLM Lanes' lane and requester counters, and the client's token sensor, show the request.
Both run in front of a simulated llama.cpp and a simulated Ollama (``conftest.sim_config``).
"""

from __future__ import annotations

from homeassistant import config_entries
from homeassistant.components import conversation
from homeassistant.const import CONF_API_KEY, CONF_MODEL, CONF_URL
from homeassistant.core import Context, HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er, intent
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.lanes import Lane
from tests.support.entities import async_flush_snapshots
from tests.support.entries import MODEL
from tests.support.requests import finished_requests

from .conftest import ClientKey, Gateway


async def _converse(hass: HomeAssistant, entry: MockConfigEntry) -> str:
    """Set up a core integration's entry and have its agent answer one turn."""
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    (agent,) = [
        e.entity_id
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
        if e.domain == "conversation"
    ]
    result = await conversation.async_converse(
        hass, "What is on in the kitchen?", None, Context(), agent_id=agent
    )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    speech = result.response.speech["plain"]["speech"]
    assert speech
    assert await hass.config_entries.async_unload(entry.entry_id)
    return speech


async def _assert_counted(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    client: ClientKey,
    lane: Lane,
    name: str,
) -> None:
    """Check that the lane and the client's requester counted the turn, and its sensor's name."""
    snapshot = entry.runtime_data.scheduler.snapshot()
    assert snapshot.lanes[lane].finished_total >= 1
    tokens = snapshot.requesters[client.requester]
    assert tokens.finished_total >= 1
    await async_flush_snapshots(hass)
    sensor = er.async_get(hass).async_get_entity_id(
        "sensor", DOMAIN, f"{entry.entry_id}_requester_tokens_{client.requester}"
    )
    assert sensor is not None
    state = hass.states.get(sensor)
    assert state is not None
    assert (
        int(state.state) == tokens.prompt_tokens_total + tokens.output_tokens_total > 0
    )
    assert name in state.attributes["friendly_name"]


def _core_entry(domain: str, gateway: Gateway, client: ClientKey) -> MockConfigEntry:
    """Build the entry of Home Assistant's ``ollama`` or ``llama_cpp`` integration, as a client."""
    if domain == "ollama":
        data = {CONF_URL: gateway.ollama_url(client.api_key)}
        agent = {CONF_MODEL: MODEL}
        versions = {"version": 3, "minor_version": 3}
    else:
        data = {"base_url": gateway.openai_url, CONF_API_KEY: client.api_key}
        agent = {"chat_model": MODEL, "streaming": True}
        versions = {}
    return MockConfigEntry(
        domain=domain,
        data=data,
        subentries_data=[
            {
                "subentry_type": "conversation",
                "data": agent,
                "title": f"{domain} via LLM Lanes",
                "unique_id": None,
            }
        ],
        **versions,
    )


@pytest.mark.parametrize(
    ("domain", "lane"), [("ollama", Lane.VOICE), ("llama_cpp", Lane.AUTOMATION)]
)
async def test_core_integration_as_a_client(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
    domain: str,
    lane: Lane,
) -> None:
    """A core integration pointed at the gateway answers a turn, in its client's lane.

    Home Assistant's llama.cpp integration asks for 3,000 output tokens: the lane's limit caps
    them, nothing is refused.
    """
    name = f"Core {domain}"
    client = await gateway.add_client(init_integration, name=name, lane=lane.key)
    finished = finished_requests(init_integration)
    await _converse(hass, _core_entry(domain, gateway, client))
    assert [(f.lane, f.requester, f.outcome) for f in finished] == [
        (lane, client.requester, "ok")
    ]
    await _assert_counted(hass, init_integration, client, lane, name)


async def test_core_ollama_entry_is_titled_with_the_key(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """Home Assistant's Ollama flow titles its entry with the URL, key included (README).

    Renaming the entry hides it; the URL it uses stays.
    """
    client = await gateway.add_client(init_integration, name="Core Ollama")
    url = gateway.ollama_url(client.api_key)
    result = await hass.config_entries.flow.async_init(
        "ollama", context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: url}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == url
    assert client.api_key in result["title"]
    entry = result["result"]
    hass.config_entries.async_update_entry(entry, title="Ollama via LLM Lanes")
    assert client.api_key not in entry.title
    assert entry.data[CONF_URL] == url
