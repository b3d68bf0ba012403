"""AI Task entities against the simulated server: text and structured data, automation lane."""

from __future__ import annotations

from homeassistant.components import ai_task
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import selector
import probatio
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.core.lanes import Lane

from .support.requests import finished_requests

ENTITY = "ai_task.sim_ai_task"


async def test_generate_text(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Free text comes back; the request ran in the automation lane as ``ai_task``."""
    finished = finished_requests(init_integration)
    result = await ai_task.async_generate_data(
        hass, task_name="summary", entity_id=ENTITY, instructions="Summarize the day"
    )
    assert isinstance(result.data, str) and result.data
    assert [(f.lane, f.requester) for f in finished] == [(Lane.AUTOMATION, "ai_task")]


async def test_generate_structured(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """With a structure, the server is asked for matching JSON and it is parsed."""
    structure = probatio.Schema(
        {
            probatio.Required("room"): selector.TextSelector(),
            probatio.Required("count"): selector.NumberSelector(
                selector.NumberSelectorConfig(min=0, max=10)
            ),
        }
    )
    result = await ai_task.async_generate_data(
        hass,
        task_name="count",
        entity_id=ENTITY,
        instructions="Count the people per room",
        structure=structure,
    )
    assert isinstance(result.data, dict)
    assert set(result.data) == {"room", "count"}


async def test_requester_is_the_user(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A user's call is charged to that user."""
    finished = finished_requests(init_integration)
    await ai_task.async_generate_data(
        hass,
        task_name="t",
        entity_id=ENTITY,
        instructions="Say hi",
        context=Context(user_id="u1"),
    )
    assert finished[0].requester == "user:u1"


async def test_requester_is_the_automation(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A call from an automation's run is charged to that automation."""
    finished = finished_requests(init_integration)
    run = Context()
    hass.states.async_set("automation.morning", "on", context=run)
    await ai_task.async_generate_data(
        hass, task_name="t", entity_id=ENTITY, instructions="Say hi", context=run
    )
    assert finished[0].requester == "automation:automation.morning"


async def test_refused_request_raises_translated_error(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A lane limit surfaces as a Home Assistant error with a translation key."""
    scheduler = init_integration.runtime_data.scheduler
    scheduler.update_settings(
        scheduler.settings.with_lane(Lane.AUTOMATION, max_prompt_tokens=1)
    )
    with pytest.raises(HomeAssistantError) as err:
        await ai_task.async_generate_data(
            hass, task_name="t", entity_id=ENTITY, instructions="Say hi"
        )
    assert err.value.translation_key == "limit_exceeded"
