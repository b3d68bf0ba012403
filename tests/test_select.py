"""Select: the scheduling policy, stored in the options and applied live."""

from __future__ import annotations

from homeassistant.components.select import (
    ATTR_OPTION,
    ATTR_OPTIONS,
    DOMAIN as SELECT_DOMAIN,
    SERVICE_SELECT_OPTION,
)
from homeassistant.const import ATTR_ENTITY_ID
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_POLICY
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import Policy

from .support.entities import entity_id_for, state_of
from .support.requests import async_generate


async def test_policy(hass: HomeAssistant, init_integration: MockConfigEntry) -> None:
    """Lanes by default; first-come-first-served on request; requests still run."""
    if True:
        entry = init_integration
        scheduler = entry.runtime_data.scheduler
        entity_id = entity_id_for(hass, entry, "select", OPT_POLICY)
        state = hass.states.get(entity_id)
        assert state is not None
        assert state.state == "lanes"
        assert state.attributes[ATTR_OPTIONS] == ["lanes", "fifo"]

        await hass.services.async_call(
            SELECT_DOMAIN,
            SERVICE_SELECT_OPTION,
            {ATTR_ENTITY_ID: entity_id, ATTR_OPTION: "fifo"},
            blocking=True,
        )
        await hass.async_block_till_done()

        assert entry.options[OPT_POLICY] == "fifo"
        assert scheduler.settings.policy is Policy.FIFO
        assert state_of(hass, entry, "select", OPT_POLICY) == "fifo"
        result = await async_generate(entry, lane=Lane.VOICE, requester="user:abc")
        assert result.finished.outcome == "ok"

        with pytest.raises(Exception):  # noqa: B017, PT011 - HA's ServiceValidationError
            await hass.services.async_call(
                SELECT_DOMAIN,
                SERVICE_SELECT_OPTION,
                {ATTR_ENTITY_ID: entity_id, ATTR_OPTION: "random"},
                blocking=True,
            )
        assert entry.options[OPT_POLICY] == "fifo"
        assert await hass.config_entries.async_unload(entry.entry_id)
