"""Numbers: max sequences and background share, stored in the options and applied live."""

from __future__ import annotations

from homeassistant.components.number import ATTR_VALUE, SERVICE_SET_VALUE
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_BACKGROUND_SHARE, OPT_MAX_SEQUENCES
from custom_components.llm_lanes.core.settings import SchedulerSettings
from tools.simulator.server import SimConfig

from .support.entities import async_call_entity_action, async_set_options, state_of


@pytest.fixture
def sim_config() -> SimConfig:
    """Run a simulated server with three slots."""
    return SimConfig(slots=3, speed=50)


async def _set(
    hass: HomeAssistant, entry: MockConfigEntry, key: str, value: float
) -> None:
    await async_call_entity_action(
        hass, entry, "number", key, SERVICE_SET_VALUE, **{ATTR_VALUE: value}
    )


@pytest.mark.parametrize(
    ("key", "shown", "typed", "stored", "shown_after"),
    [
        # Defaults to the server's slots.
        (OPT_MAX_SEQUENCES, 3, 2, 2, 2),
        # Shown in percent (to one decimal), stored as a fraction.
        (
            OPT_BACKGROUND_SHARE,
            round(SchedulerSettings().background_share * 100, 1),
            25,
            0.25,
            25.0,
        ),
    ],
)
async def test_a_new_value_reaches_the_options_and_the_scheduler(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    *,
    key: str,
    shown: float,
    typed: float,
    stored: float,
    shown_after: float,
) -> None:
    """The setting is shown; a new value is stored in the options and applied live."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    assert state_of(hass, entry, "number", key) == str(shown)

    await _set(hass, entry, key, typed)

    assert entry.options[key] == stored
    assert getattr(scheduler.settings, key) == stored
    assert state_of(hass, entry, "number", key) == str(shown_after)


async def test_follows_options_changed_elsewhere(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A change made in the options flow shows at once."""
    entry = init_integration
    await async_set_options(
        hass, entry, **{OPT_MAX_SEQUENCES: 1, OPT_BACKGROUND_SHARE: 0.5}
    )

    assert state_of(hass, entry, "number", OPT_MAX_SEQUENCES) == "1"
    assert float(state_of(hass, entry, "number", OPT_BACKGROUND_SHARE)) == 50


async def test_out_of_range_is_refused(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Zero sequences is outside the range: refused, options unchanged."""
    entry = init_integration
    with pytest.raises(ServiceValidationError):
        await _set(hass, entry, OPT_MAX_SEQUENCES, 0)
    assert OPT_MAX_SEQUENCES not in entry.options
