"""The real llama-server started as a household starts it: ``--parallel 4`` with the default context.

llama.cpp's default context (4,096 tokens) shared by four slots gives each request 1,024 tokens.
The issue's three failures on such a server, each fixed: the set-up raises the repair that says
what to change, an Assist turn too long for the slot is refused with a clear translated error
(nothing sent), ``summarize`` of a 300-token text with an 8-token instruction runs, and
``run_benchmark`` runs to the end with every request within the slot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from homeassistant.core import HomeAssistant
from homeassistant.helpers import intent, issue_registry as ir
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    CONF_LLM_HASS_API,
    CONF_MODEL,
    DOMAIN,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.repairs import small_context_issue_id
from tests.support.entities import async_expose_lights
from tests.support.entries import async_llama_entry
from tests.support.llamacpp import MODEL_ALIAS, LlamaServer
from tests.support.requests import async_call_action, async_say, finished_requests

pytestmark = pytest.mark.llamacpp

AGENT = "conversation.small_agent"


@pytest.fixture
async def small_entry(
    ha_core: HomeAssistant, llama_server: LlamaServer, socket_enabled: None
) -> AsyncIterator[MockConfigEntry]:
    """Set up an LLM Lanes entry for that server, with an Assist agent for the home."""
    assert llama_server.context_per_slot == 1024
    async with async_llama_entry(
        ha_core,
        llama_server,
        "Small",
        subentries_data=[
            {
                "subentry_type": SUBENTRY_CONVERSATION,
                "data": {CONF_MODEL: MODEL_ALIAS, CONF_LLM_HASS_API: ["assist"]},
                "subentry_id": "conversation_small",
                "title": "Small agent",
                "unique_id": None,
            }
        ],
    ) as entry:
        yield entry


async def test_setup_raises_the_repair(
    hass: HomeAssistant, small_entry: MockConfigEntry
) -> None:
    """The repair names the 1,024 tokens found and the --ctx-size or --parallel to use."""
    issue = ir.async_get(hass).async_get_issue(
        DOMAIN, small_context_issue_id(small_entry.entry_id)
    )
    assert issue is not None
    assert issue.translation_key == "small_context_ctx_size"
    assert issue.translation_placeholders is not None
    placeholders = issue.translation_placeholders
    assert (placeholders["context"], placeholders["slots"]) == ("1024", "4")
    assert (placeholders["ctx_size"], placeholders["parallel"]) == ("32768", "1")


async def test_an_assist_sized_turn_gets_a_clear_error(
    hass: HomeAssistant, small_entry: MockConfigEntry
) -> None:
    """Assist's prompt with 40 exposed lights and its tools: refused, translated, unsent."""
    await async_expose_lights(hass, 40)
    finished = finished_requests(small_entry)
    result = await async_say(
        hass, AGENT, "Turn on the light in room 3", "satellite-kitchen"
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    speech = result.response.speech["plain"]["speech"]
    assert "does not fit the LLM server" in speech
    assert "1024 tokens one request may hold" in speech
    assert finished == []


async def test_summarize_runs_on_the_small_slots(
    hass: HomeAssistant, small_entry: MockConfigEntry
) -> None:
    """An 8-token instruction and a 300-token text: summarized (before, refused 20 of 20)."""
    text = " ".join(f"At {hour}:00 the hall light turned on." for hour in range(32))
    response = await async_call_action(
        hass,
        "summarize",
        text=text,
        instructions="Summarize the day in one sentence.",
        run_now=True,
        wait=True,
    )
    assert response["status"] == "done"
    assert response["text"]
    assert response["prompt_note"] is None


async def test_run_benchmark_runs_within_the_slots(
    hass: HomeAssistant, small_entry: MockConfigEntry
) -> None:
    """The calibration scales its prompts to the 1,024-token slots; the server fails none.

    Before, its prefill probe alone (2,319 tokens with this tokenizer) failed the action.
    """
    response = await async_call_action(
        hass,
        "run_benchmark",
        config_entry_id=small_entry.entry_id,
        scenario="voice_vs_background",
        duration_s=2,
        force=True,
    )
    assert response["context_per_slot"] == 1024
    assert response["scaled_to_context"]
    # The prefill probe fitted the slot (a refused one fails the action); the speed it measured
    # is wall-clock timing, the benchmark's to judge: on a loaded machine the long probe can time
    # no slower than the short one, and then there is none.
    prefill = response["curve"]["prefill_tok_s"]
    assert prefill is None or prefill > 0
    assert [point["sequences"] for point in response["curve"]["points"]] == [1, 2, 3, 4]
    rows = response["rows"]
    assert [row["settings"]["max_sequences"] for row in rows] == [
        "1",
        "1",
        "2",
        "2",
        "4",
        "4",
    ]
    # A prompt over the slot is answered at once with HTTP 400: none was, whatever the speed.
    assert all(row["failed"] == 0 for row in rows)
    # Two seconds a setting cannot tell them apart: it says so (nothing was asked to apply).
    assert response["verdict"] == "too_short"
    assert response["applied"] == {}
