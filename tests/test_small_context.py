"""A server whose slots hold 1,024 tokens (llama.cpp's default context with ``--parallel 4``).

Against the simulated server with that context: the config flow warns, the entry raises a repair
naming what to change for its kind (and clears it once the server has more), the lanes' default
answers leave room for a prompt, an Assist turn too long for the slot is refused with a clear
error before anything is sent, and ``summarize`` trims a long text instead of refusing it. The
same with the real llama-server is in ``test_small_context_llamacpp.py``.
"""

from __future__ import annotations

from homeassistant import config_entries
from homeassistant.components import conversation
from homeassistant.const import CONF_URL
from homeassistant.core import Context, HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import intent, issue_registry as ir
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import CONF_MODEL, DOMAIN
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.repairs import small_context_issue_id
from tools.simulator.server import SimConfig, SimulatedServer

from .support.entities import async_expose_lights
from .support.requests import async_call_action, finished_requests

SLOTS = 4
CONTEXT_PER_SLOT = 1024
AGENT = "conversation.sim_agent"


@pytest.fixture
def sim_config() -> SimConfig:
    """Four slots sharing 4,096 tokens: llama-server's default context with --parallel 4."""
    return SimConfig(
        slots=SLOTS, speed=50.0, kv_capacity_tokens=SLOTS * CONTEXT_PER_SLOT
    )


@pytest.mark.usefixtures("ha_core")
async def test_the_config_flow_warns_before_adding_the_server(
    hass: HomeAssistant, sim: SimulatedServer, sim_config: SimConfig
) -> None:
    """After the model, a step says the slots are too small; the server can be added anyway."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: sim.url}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_MODEL: sim_config.model}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "small_context"
    placeholders = result["description_placeholders"]
    assert placeholders is not None
    assert (placeholders["context"], placeholders["slots"]) == ("1024", "4")
    assert placeholders["minimum"] == "4096"

    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    entry = result["result"]
    issue = ir.async_get(hass).async_get_issue(
        DOMAIN, small_context_issue_id(entry.entry_id)
    )
    assert issue is not None
    assert await hass.config_entries.async_unload(entry.entry_id)


@pytest.mark.usefixtures("ha_core")
@pytest.mark.parametrize(
    ("kind", "translation_key"),
    [
        ("llama_cpp", "small_context_ctx_size"),
        ("ollama", "small_context_context_length"),
    ],
)
async def test_the_repair_says_what_to_change_and_clears_itself(
    hass: HomeAssistant,
    sim: SimulatedServer,
    mock_config_entry: MockConfigEntry,
    kind: str,
    translation_key: str,
) -> None:
    """The repair names the context found and the server's own setting; more context clears it.

    Meanwhile every lane's default answer takes at most a quarter of the slot.
    """
    await sim.restart(kind=kind)
    mock_config_entry.add_to_hass(hass)
    hass.config_entries.async_update_entry(
        mock_config_entry, data={**mock_config_entry.data, "kind": kind}
    )
    assert await hass.config_entries.async_setup(mock_config_entry.entry_id)
    await hass.async_block_till_done()
    runtime = mock_config_entry.runtime_data
    issues = ir.async_get(hass)
    issue_id = small_context_issue_id(mock_config_entry.entry_id)
    issue = issues.async_get_issue(DOMAIN, issue_id)
    assert issue is not None
    assert issue.translation_key == translation_key
    assert issue.severity is ir.IssueSeverity.WARNING
    assert issue.translation_placeholders is not None
    assert issue.translation_placeholders["context"] == "1024"
    assert issue.translation_placeholders["recommended"] == "8192"
    if kind == "llama_cpp":
        # --ctx-size for four slots of 8,192 tokens, or one slot in the memory of today's four.
        assert issue.translation_placeholders["ctx_size"] == "32768"
        assert issue.translation_placeholders["parallel"] == "1"
    for lane in LANES:
        assert runtime.scheduler.settings.lanes[lane].default_output_tokens <= 256

    await sim.restart(kv_capacity_tokens=SLOTS * 8192)
    await runtime.server.async_refresh()
    await hass.async_block_till_done()
    assert runtime.server.context_per_slot == 8192
    assert issues.async_get_issue(DOMAIN, issue_id) is None
    assert runtime.scheduler.settings.lanes[Lane.BACKGROUND].default_output_tokens == (
        Lane.BACKGROUND.defaults.default_output_tokens
    )
    assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_an_assist_turn_too_long_for_the_slot_is_refused_clearly(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """Assist's prompt with its tools and exposed entities cannot fit: a translated error.

    It names the prompt, the answer and the slot, and says what to change; nothing reaches the
    server. A short chat without Home Assistant's tools still fits and is answered.
    """
    await async_expose_lights(hass, 40)
    finished = finished_requests(init_integration)

    result = await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(), agent_id=AGENT
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    speech = result.response.speech["plain"]["speech"]
    assert "1024 tokens one request may hold" in speech
    assert "Repairs" in speech
    assert sim.requests_seen == []
    assert finished == []

    subentry = init_integration.subentries["conversation_1"]
    hass.config_entries.async_update_subentry(
        init_integration, subentry, data={CONF_MODEL: subentry.data[CONF_MODEL]}
    )
    await hass.async_block_till_done()
    result = await conversation.async_converse(
        hass, "Hello", None, Context(), agent_id=AGENT
    )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE


async def test_summarize_trims_instead_of_refusing(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """An 8-token instruction and a 300-token text run; a 3,000-token one is trimmed, noted."""
    for repeats in (37, 370):
        response = await async_call_action(
            hass,
            "summarize",
            text="The boiler ran for three hours. " * repeats,
            instructions="Summarize it in one sentence.",
            run_now=True,
            wait=True,
        )
        assert response["status"] == "done"
        assert response["text"]
        if repeats == 37:
            assert response["prompt_note"] is None
    assert "trimmed to fit the context limit of 768 tokens" in response["prompt_note"]
    assert response["prompt_tokens"] <= 768
