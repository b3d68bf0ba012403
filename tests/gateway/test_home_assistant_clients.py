"""Home Assistant's own LLM integrations as gateway clients: ``ollama`` and ``llama_cpp``.

Each is set up in the test harness against the gateway (Ollama's URL = the client's Ollama host
URL, llama.cpp's base URL = the OpenAI endpoint with the client key) and answers a conversation
turn; LLM Lanes' lane and requester counters, and the client's token sensor, show the request.
Both run in front of a simulated llama.cpp and a simulated Ollama (``conftest.sim_config``).
"""

from __future__ import annotations

from homeassistant.components import conversation
from homeassistant.const import CONF_API_KEY, CONF_MODEL, CONF_URL
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import entity_registry as er, intent
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.lanes import Lane
from tests.support.entities import async_flush_snapshots
from tests.support.entries import MODEL
from tests.support.requests import finished_requests

from .conftest import ClientKey, Gateway


async def _converse(hass: HomeAssistant, entry: MockConfigEntry, platform: str) -> str:
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


async def test_core_ollama_integration(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """Home Assistant's Ollama integration, pointed at the client's host URL, answers a turn."""
    client = await gateway.add_client(
        init_integration, name="Core Ollama", lane="voice"
    )
    finished = finished_requests(init_integration)
    ollama_entry = MockConfigEntry(
        domain="ollama",
        version=3,
        minor_version=3,
        data={CONF_URL: gateway.ollama_url(client.api_key)},
        subentries_data=[
            {
                "subentry_type": "conversation",
                "data": {CONF_MODEL: MODEL},
                "title": "Ollama via LLM Lanes",
                "unique_id": None,
            }
        ],
    )
    await _converse(hass, ollama_entry, "ollama")
    assert [(f.lane, f.requester, f.outcome) for f in finished] == [
        (Lane.VOICE, client.requester, "ok")
    ]
    await _assert_counted(hass, init_integration, client, Lane.VOICE, "Core Ollama")


async def test_core_llama_cpp_integration(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """Home Assistant's llama.cpp integration, with the OpenAI base URL and key, answers a turn."""
    client = await gateway.add_client(
        init_integration, name="Core llama.cpp", lane="automation"
    )
    finished = finished_requests(init_integration)
    llama_entry = MockConfigEntry(
        domain="llama_cpp",
        data={"base_url": gateway.openai_url, CONF_API_KEY: client.api_key},
        subentries_data=[
            {
                "subentry_type": "conversation",
                "data": {"chat_model": MODEL, "streaming": True},
                "title": "llama.cpp via LLM Lanes",
                "unique_id": None,
            }
        ],
    )
    await _converse(hass, llama_entry, "llama_cpp")
    # Home Assistant asks for 3,000 output tokens; the lane's limit caps it, nothing is refused.
    assert [(f.lane, f.requester, f.outcome) for f in finished] == [
        (Lane.AUTOMATION, client.requester, "ok")
    ]
    await _assert_counted(
        hass, init_integration, client, Lane.AUTOMATION, "Core llama.cpp"
    )
