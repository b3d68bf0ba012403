"""For the entity tests: find an entity by its key, read its state, use it, let snapshots through."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.const import ATTR_ENTITY_ID
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
)

from custom_components.llm_lanes.const import DOMAIN


def entity_id_for(
    hass: HomeAssistant, entry: MockConfigEntry, platform: str, key: str
) -> str:
    """Entity id of the entity whose key (unique id suffix) is ``key``."""
    entity_id = er.async_get(hass).async_get_entity_id(
        platform, DOMAIN, f"{entry.entry_id}_{key}"
    )
    assert entity_id is not None, f"no {platform} entity with key {key!r}"
    return entity_id


def state_of(
    hass: HomeAssistant, entry: MockConfigEntry, platform: str, key: str
) -> str:
    """State of the entity whose key is ``key``."""
    state = hass.states.get(entity_id_for(hass, entry, platform, key))
    assert state is not None
    return state.state


async def async_flush_snapshots(hass: HomeAssistant, seconds: float = 1.5) -> None:
    """Let the throttled snapshot refresh (and any timer due within ``seconds``) run."""
    await hass.async_block_till_done()
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=seconds))
    # Timed coordinator refreshes (the server poll) run as background tasks.
    await hass.async_block_till_done(wait_background_tasks=True)


async def async_call_entity_action(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    platform: str,
    key: str,
    action: str,
    **data: Any,
) -> None:
    """Call ``<platform>.<action>`` on the entity with this key, and let its effects settle."""
    await hass.services.async_call(
        platform,
        action,
        {ATTR_ENTITY_ID: entity_id_for(hass, entry, platform, key), **data},
        blocking=True,
    )
    await hass.async_block_till_done()


async def async_set_options(
    hass: HomeAssistant, entry: MockConfigEntry, **options: Any
) -> None:
    """Change some of the entry's options (as the options flow would) and let them apply."""
    hass.config_entries.async_update_entry(entry, options={**entry.options, **options})
    await hass.async_block_till_done()


async def async_expose_lights(hass: HomeAssistant, count: int) -> None:
    """Give Assist ``count`` lights to control (an Assist prompt that grows with the house)."""
    assert await async_setup_component(hass, "intent", {})
    for index in range(count):
        entity_id = f"light.room_{index}"
        hass.states.async_set(
            entity_id, "off", {"friendly_name": f"Room {index} light"}
        )
        async_expose_entity(hass, conversation.DOMAIN, entity_id, True)
