"""Numbers: max sequences and background share, stored in the options and applied live."""

from __future__ import annotations

from homeassistant.components.number import ATTR_VALUE, SERVICE_SET_VALUE
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_BACKGROUND_SHARE, OPT_MAX_SEQUENCES
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


async def test_max_sequences(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Defaults to the server's slots; a new value reaches the options and the scheduler."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    assert state_of(hass, entry, "number", OPT_MAX_SEQUENCES) == "3"

    await _set(hass, entry, OPT_MAX_SEQUENCES, 2)

    assert entry.options[OPT_MAX_SEQUENCES] == 2
    assert scheduler.settings.max_sequences == 2
    assert state_of(hass, entry, "number", OPT_MAX_SEQUENCES) == "2"


async def test_background_share(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Shown in percent, stored as a fraction."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    default = scheduler.settings.background_share
    assert float(
        state_of(hass, entry, "number", OPT_BACKGROUND_SHARE)
    ) == pytest.approx(default * 100)

    await _set(hass, entry, OPT_BACKGROUND_SHARE, 25)

    assert entry.options[OPT_BACKGROUND_SHARE] == 0.25
    assert scheduler.settings.background_share == 0.25
    assert float(state_of(hass, entry, "number", OPT_BACKGROUND_SHARE)) == 25


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
