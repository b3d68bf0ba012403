"""The ``llm_lanes.generate`` action: answers, validation and errors."""

from __future__ import annotations

from freezegun.api import FrozenDateTimeFactory
from homeassistant.const import ATTR_CONFIG_ENTRY_ID
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
import probatio
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.lanes import Lane


async def _generate(
    hass: HomeAssistant, context: Context | None = None, **data: object
) -> dict:
    response = await hass.services.async_call(
        DOMAIN, "generate", data, blocking=True, return_response=True, context=context
    )
    assert isinstance(response, dict)
    return response


async def test_generate_returns_text_tokens_and_timings(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """The answer comes back with token counts and timings, in the automation lane."""
    response = await _generate(
        hass,
        config_entry_id=init_integration.entry_id,
        prompt="What is the weather?",
        instructions="Answer briefly.",
        max_tokens=5,
    )
    assert response["text"]
    assert response["lane"] == "automation"
    assert response["requester"] == "generate"
    assert 0 < response["output_tokens"] <= 5
    assert response["prompt_tokens"] > 0
    assert response["ttft_s"] is not None and response["e2e_s"] >= response["ttft_s"]


async def test_generate_lane_and_requester(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """The caller picks the lane and the requester; a user call defaults to the user."""
    response = await _generate(
        hass,
        config_entry_id=init_integration.entry_id,
        prompt="Hi",
        lane="background",
        requester="kitchen_tablet",
    )
    assert (response["lane"], response["requester"]) == ("background", "kitchen_tablet")
    response = await _generate(
        hass,
        Context(user_id="u9"),
        config_entry_id=init_integration.entry_id,
        prompt="Hi",
    )
    assert response["requester"] == "user:u9"


async def test_generate_validation(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Bad input, an unknown server and a broken lane limit are validation errors."""
    with pytest.raises(probatio.Invalid):
        await _generate(hass, config_entry_id=init_integration.entry_id, prompt="")
    with pytest.raises(probatio.Invalid):
        await _generate(
            hass, config_entry_id=init_integration.entry_id, prompt="x", lane="urgent"
        )
    with pytest.raises(ServiceValidationError):
        await _generate(hass, config_entry_id="nope", prompt="x")
    with pytest.raises(ServiceValidationError) as err:
        await _generate(
            hass,
            config_entry_id=init_integration.entry_id,
            prompt="x",
            max_tokens=100000,
        )
    assert err.value.translation_key == "limit_exceeded"


async def test_generate_quota_and_closed(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Quota past with reject, and a closed scheduler, are translated errors."""
    hass.config_entries.async_update_entry(
        init_integration, options={"quota_tokens_per_day": 1, "quota_action": "reject"}
    )
    await hass.async_block_till_done()
    await _generate(
        hass, config_entry_id=init_integration.entry_id, prompt="Hi", requester="r"
    )
    with pytest.raises(HomeAssistantError) as err:
        await _generate(
            hass, config_entry_id=init_integration.entry_id, prompt="Hi", requester="r"
        )
    assert err.value.translation_key == "quota_exceeded"

    await init_integration.runtime_data.scheduler.close()
    with pytest.raises(HomeAssistantError) as err:
        await _generate(
            hass, **{ATTR_CONFIG_ENTRY_ID: init_integration.entry_id, "prompt": "Hi"}
        )
    assert err.value.translation_key == "scheduler_closed"
    assert Lane.AUTOMATION.key == "automation"


async def test_run_benchmark_recommends_and_applies(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A short calibration on the simulated server returns a table and applies the pick."""
    response = await hass.services.async_call(
        DOMAIN,
        "run_benchmark",
        {
            "config_entry_id": init_integration.entry_id,
            "scenario": "voice_vs_background",
            "duration_s": 1,
            "apply": True,
            "force": True,
        },
        blocking=True,
        return_response=True,
    )
    assert isinstance(response, dict)
    assert (
        len(response["rows"]) == 4
    )  # max sequences 1, 2 (the server's slots) x 2 budgets
    assert response["recommended"]
    assert response["applied"]
    await hass.async_block_till_done()
    scheduler = init_integration.runtime_data.scheduler
    assert scheduler.settings.max_sequences == int(
        response["recommended"]["max_sequences"]
    )
    assert init_integration.options["max_sequences"] == scheduler.settings.max_sequences


async def test_run_benchmark_waits_for_the_quiet_hours(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    freezer: FrozenDateTimeFactory,
) -> None:
    """Outside the nightly window the calibration is refused unless forced; nothing changes."""
    await hass.config.async_set_time_zone("UTC")
    freezer.move_to("2026-11-29 14:00:00+00:00")
    options = dict(init_integration.options)
    with pytest.raises(ServiceValidationError) as err:
        await hass.services.async_call(
            DOMAIN,
            "run_benchmark",
            {"config_entry_id": init_integration.entry_id, "apply": True},
            blocking=True,
            return_response=True,
        )
    assert err.value.translation_key == "outside_quiet_hours"
    assert err.value.translation_placeholders == {"start": "01:00", "end": "06:00"}
    assert dict(init_integration.options) == options
