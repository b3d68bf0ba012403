"""Select: the scheduling policy, stored in the options and applied live."""

from __future__ import annotations

from homeassistant.components.select import ATTR_OPTIONS, SERVICE_SELECT_OPTION
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_POLICY
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import Policy

from .support.entities import async_call_entity_action, entity_id_for, state_of
from .support.requests import async_generate


async def _select(hass: HomeAssistant, entry: MockConfigEntry, option: str) -> None:
    await async_call_entity_action(
        hass, entry, "select", OPT_POLICY, SERVICE_SELECT_OPTION, option=option
    )


async def test_policy(hass: HomeAssistant, init_integration: MockConfigEntry) -> None:
    """Lanes by default; first-come-first-served on request; requests still run."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    state = hass.states.get(entity_id_for(hass, entry, "select", OPT_POLICY))
    assert state is not None
    assert state.state == "lanes"
    assert state.attributes[ATTR_OPTIONS] == ["lanes", "fifo"]

    await _select(hass, entry, "fifo")

    assert entry.options[OPT_POLICY] == "fifo"
    assert scheduler.settings.policy is Policy.FIFO
    assert state_of(hass, entry, "select", OPT_POLICY) == "fifo"
    result = await async_generate(entry, lane=Lane.VOICE, requester="user:abc")
    assert result.finished.outcome == "ok"

    with pytest.raises(ServiceValidationError):
        await _select(hass, entry, "random")
    assert entry.options[OPT_POLICY] == "fifo"
    assert await hass.config_entries.async_unload(entry.entry_id)
