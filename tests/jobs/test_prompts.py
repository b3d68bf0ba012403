"""Job prompts from the recorder's history of real entities, trimmed to the context limit."""

from __future__ import annotations

from datetime import timedelta

from freezegun.api import FrozenDateTimeFactory
from homeassistant.components.recorder import Recorder
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.components.recorder.common import (
    async_wait_recording_done,
)

from custom_components.llm_lanes.jobs.prompts import (
    async_history_lines,
    async_history_prompt,
    lines_prompt,
    text_prompt,
)
from tests.jobs.support import local_time

TEMPERATURE = "sensor.living_room_temperature"
DOOR = "binary_sensor.front_door"


@pytest.fixture(autouse=True)
def auto_enable_custom_integrations(recorder_db_url: str) -> None:
    """Replace the shared autouse fixture: the recorder's database must exist before ``hass``.

    These tests load no integration of ours, so custom integrations need not be enabled.
    """


async def record_evening(hass: HomeAssistant, freezer: FrozenDateTimeFactory) -> None:
    """Record a few state changes of a temperature sensor and a door, ten minutes apart."""
    await hass.config.async_set_time_zone("Europe/Paris")
    changes = [
        (
            TEMPERATURE,
            "20.5",
            {"friendly_name": "Living room", "unit_of_measurement": "°C"},
        ),
        (DOOR, "off", {"friendly_name": "Front door"}),
        (
            TEMPERATURE,
            "21.0",
            {"friendly_name": "Living room", "unit_of_measurement": "°C"},
        ),
        (DOOR, "on", {"friendly_name": "Front door"}),
        (
            TEMPERATURE,
            "19.5",
            {"friendly_name": "Living room", "unit_of_measurement": "°C"},
        ),
    ]
    when = local_time(29, 18)
    for entity_id, state, attributes in changes:
        freezer.move_to(when)
        hass.states.async_set(entity_id, state, attributes)
        await hass.async_block_till_done()
        when += timedelta(minutes=10)
    freezer.move_to(local_time(29, 20))
    await async_wait_recording_done(hass)


async def test_history_lines_from_the_recorder(
    recorder_mock: Recorder, hass: HomeAssistant, freezer: FrozenDateTimeFactory
) -> None:
    """Every recorded change of the entities comes back as a logbook-like line, oldest first."""
    await record_evening(hass, freezer)
    lines = await async_history_lines(
        hass, [TEMPERATURE, DOOR], local_time(29, 17), local_time(29, 20)
    )
    assert lines == [
        "2026-11-29 18:00 Living room: 20.5 °C",
        "2026-11-29 18:10 Front door: off",
        "2026-11-29 18:20 Living room: 21.0 °C",
        "2026-11-29 18:30 Front door: on",
        "2026-11-29 18:40 Living room: 19.5 °C",
    ]


async def test_history_prompt_keeps_the_newest_lines_with_a_note(
    recorder_mock: Recorder, hass: HomeAssistant, freezer: FrozenDateTimeFactory
) -> None:
    """Over the context limit, the oldest changes are left out and the prompt says so."""
    await record_evening(hass, freezer)
    full = await async_history_prompt(
        hass, [TEMPERATURE, DOOR], timedelta(hours=3), "What happened?", 16384
    )
    assert full.note is None
    assert "18:00 Living room: 20.5 °C" in full.user
    assert full.user.startswith("What happened?")

    # Room for all but the two oldest lines (each about 11 tokens) once the note is reserved.
    tight_limit = full.tokens_estimate + 64 - 12
    trimmed = await async_history_prompt(
        hass, [TEMPERATURE, DOOR], timedelta(hours=3), "What happened?", tight_limit
    )
    assert trimmed.note is not None
    assert f"context limit of {tight_limit} tokens" in trimmed.note
    assert "18:00 Living room" not in trimmed.user
    assert "18:40 Living room: 19.5 °C" in trimmed.user
    assert trimmed.user.endswith(f"({trimmed.note})")
    assert trimmed.tokens_estimate <= tight_limit


async def test_history_prompt_of_a_quiet_period(
    recorder_mock: Recorder, hass: HomeAssistant, freezer: FrozenDateTimeFactory
) -> None:
    """An entity without recorded changes gives a prompt that says nothing was recorded."""
    await record_evening(hass, freezer)
    prompt = await async_history_prompt(
        hass, ["sensor.unknown"], timedelta(hours=1), None, 4096
    )
    assert "no state changes were recorded" in prompt.user


def test_text_and_lines_fit_their_limit() -> None:
    """Whatever the size of the source, the prompt estimate stays within the limit."""
    for limit in (200, 500, 2000):
        text = text_prompt("word " * 5000, None, limit)
        assert text.tokens_estimate <= limit
        assert text.note is not None
        lines = lines_prompt(
            [f"2026-11-29 18:{i % 60:02d} Lamp: on" for i in range(2000)], None, limit
        )
        assert lines.tokens_estimate <= limit
        assert lines.note is not None
