"""The Assist agent against the simulated server: lanes, requesters, tool calls, errors."""

from __future__ import annotations

from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import intent
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_mock_service,
)

from custom_components.llm_lanes.core.lanes import Lane

from .support.entities import async_set_options
from .support.requests import async_say, finished_requests

AGENT = "conversation.sim_agent"


async def test_typed_chat_is_interactive(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A typed chat answers through the interactive lane, charged to the user; turns continue."""
    finished = finished_requests(init_integration)
    context = Context(user_id="user123")
    result = await conversation.async_converse(
        hass, "What time is it?", None, context, agent_id=AGENT
    )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    first = result.response.speech["plain"]["speech"]
    assert first
    again = await conversation.async_converse(
        hass, "And tomorrow?", result.conversation_id, context, agent_id=AGENT
    )
    assert again.conversation_id == result.conversation_id
    assert [(f.lane, f.requester, f.outcome) for f in finished] == [
        (Lane.INTERACTIVE, "user:user123", "ok"),
        (Lane.INTERACTIVE, "user:user123", "ok"),
    ]
    # The second turn carried the first (multi-turn): more prompt tokens.
    assert finished[1].prompt_tokens > finished[0].prompt_tokens


async def test_satellite_is_voice_and_turns_on_a_light(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A satellite's command runs in the voice lane and calls a Home Assistant tool."""
    assert await async_setup_component(hass, "intent", {})
    hass.states.async_set("light.kitchen", "off", {"friendly_name": "Kitchen light"})
    async_expose_entity(hass, conversation.DOMAIN, "light.kitchen", True)
    calls = async_mock_service(hass, "light", "turn_on")
    finished = finished_requests(init_integration)

    result = await async_say(
        hass, AGENT, 'intent__HassTurnOn name="Kitchen light"', "satellite-device"
    )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    assert result.response.speech["plain"]["speech"] == "Done."
    assert [call.data["entity_id"] for call in calls] == [["light.kitchen"]]
    assert [(f.lane, f.requester) for f in finished] == [
        (Lane.VOICE, "device:satellite-device"),
        (Lane.VOICE, "device:satellite-device"),
    ]


async def test_server_error_becomes_conversation_error(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A request the lane refuses comes back as a clear error, not an exception."""
    await async_set_options(
        hass,
        init_integration,
        interactive={
            "max_queued": 1,
            "max_output_tokens": 1,
            "ttft_slo_s": 1.0,
            "itl_slo_s": 0.1,
        },
    )
    settings = init_integration.runtime_data.scheduler.settings
    init_integration.runtime_data.scheduler.update_settings(
        settings.with_lane(Lane.INTERACTIVE, max_prompt_tokens=1)
    )
    result = await conversation.async_converse(
        hass, "A question with several words", None, Context(), agent_id=AGENT
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    assert "interactive" in result.response.speech["plain"]["speech"]


async def test_unknown_llm_api_is_a_conversation_error(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """An agent set to an LLM API that no longer exists answers with an error."""
    entry = init_integration
    subentry = entry.subentries["conversation_1"]
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, "llm_hass_api": ["gone_api"]}
    )
    await hass.async_block_till_done()
    state = hass.states.get(AGENT)
    assert state is not None
    result = await conversation.async_converse(
        hass, "Hello", None, Context(), agent_id=AGENT
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    agent = conversation.async_get_agent_info(hass, AGENT)
    assert agent is not None and agent.supports_streaming
