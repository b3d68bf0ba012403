"""Helpers for the entity tests: entity look-ups, real requests, letting snapshots through.

Not a test module itself; the entity and activity tests import from it. The entry and the
simulated server come from ``conftest.py`` (``sim_config``, ``sim``, ``init_integration``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from datetime import timedelta
from unittest.mock import PropertyMock, patch

from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.util import dt as dt_util
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
)

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.backends.base import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.bench.simulator import SimConfig
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.snapshot import GenerateResult

MODEL = SimConfig().model


@pytest.fixture
def entity_registry_enabled_by_default() -> Generator[None]:
    """Create every entity enabled, including those disabled by default (as HA core's tests do)."""
    with patch(
        "homeassistant.helpers.entity.Entity.entity_registry_enabled_default",
        new_callable=PropertyMock,
        return_value=True,
    ):
        yield


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


def chat(text: str = "What time is it?", max_tokens: int = 8) -> ChatRequest:
    """Build a one-message chat request for the simulated model."""
    return ChatRequest(
        model=MODEL,
        messages=(ChatMessage(role="user", content=text),),
        max_tokens=max_tokens,
    )


async def async_generate(
    entry: MockConfigEntry,
    *,
    lane: Lane = Lane.AUTOMATION,
    requester: str = "job:test",
    text: str = "What time is it?",
    max_tokens: int = 8,
) -> GenerateResult:
    """Send one real request through the entry's scheduler to the simulated server."""
    result: GenerateResult = await entry.runtime_data.scheduler.generate(
        chat(text, max_tokens), lane=lane, requester=requester
    )
    return result


async def async_flush_snapshots(hass: HomeAssistant, seconds: float = 1.5) -> None:
    """Let the throttled snapshot refresh (and any timer due within ``seconds``) run."""
    await hass.async_block_till_done()
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=seconds))
    # Timed coordinator refreshes (the server poll) run as background tasks.
    await hass.async_block_till_done(wait_background_tasks=True)


async def async_wait_for(condition: Callable[[], bool], limit: int = 2000) -> None:
    """Yield to the event loop until ``condition`` holds (bounded, no wall-clock assertion)."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")
