"""Every platform's entities as the registry and the state machine hold them (syrupy snapshots).

One platform is set up at a time, with every entity enabled, right after set-up: nothing has run
yet, so every state is what a new installation shows.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

from homeassistant.const import CONF_URL, Platform
from homeassistant.core import HomeAssistant, State
from homeassistant.helpers import entity_registry as er
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    mock_restore_cache_with_extra_data,
    snapshot_platform,
)
from syrupy.assertion import SnapshotAssertion

from custom_components.llm_lanes import PLATFORMS
from custom_components.llm_lanes.const import DOMAIN


@pytest.mark.usefixtures("ha_core", "entity_registry_enabled_by_default")
@pytest.mark.parametrize("platform", PLATFORMS)
async def test_platform_entities(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    entity_registry: er.EntityRegistry,
    snapshot: SnapshotAssertion,
    platform: Platform,
) -> None:
    """Unique ids, names, translation keys, classes, units and first states of one platform."""
    entry = mock_config_entry
    entry.add_to_hass(hass)
    if platform is Platform.SENSOR:
        # A requester seen before a restart: its token sensor comes back with its count.
        entity_registry.async_get_or_create(
            "sensor",
            DOMAIN,
            f"{entry.entry_id}_requester_tokens_job:nightly",
            config_entry=entry,
            suggested_object_id="nightly_tokens",
        )
        mock_restore_cache_with_extra_data(
            hass,
            [
                (
                    State("sensor.nightly_tokens", "1000"),
                    {"native_value": 1000, "native_unit_of_measurement": "tokens"},
                )
            ],
        )
    # The simulated server listens on a free port, which the Server URL sensor shows.
    url = entry.data[CONF_URL]

    def same_url(*, data: Any, path: Any) -> Any:
        return "http://127.0.0.1:<sim port>" if data == url else data

    with patch("custom_components.llm_lanes.PLATFORMS", [platform]):
        assert await hass.config_entries.async_setup(entry.entry_id)
        await hass.async_block_till_done()
        await snapshot_platform(
            hass,
            entity_registry,
            snapshot.with_defaults(matcher=same_url),
            entry.entry_id,
        )
