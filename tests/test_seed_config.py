"""scripts/develop's entry is the one the config flow makes for the same server."""

from __future__ import annotations

import copy
from typing import Any

from homeassistant import config_entries
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
import pytest

from custom_components.llm_lanes.const import CONF_MODEL, DOMAIN
from tools.simulator.server import SimConfig, SimulatedServer

from .support.scripts import load_script


def _shape(entry: dict[str, Any]) -> dict[str, Any]:
    """Return what a user sees of an entry: title, data, version, subentries (ids aside)."""
    return {
        "title": entry["title"],
        "data": dict(entry["data"]),
        "unique_id": entry["unique_id"],
        "version": (entry["version"], entry["minor_version"]),
        "subentries": sorted(
            (sub["subentry_type"], sub["title"], dict(sub["data"]))
            for sub in entry["subentries"]
        ),
    }


@pytest.mark.usefixtures("ha_core")
async def test_develop_seeds_the_entry_the_flow_makes(
    hass: HomeAssistant,
    hass_storage: dict[str, Any],
    sim: SimulatedServer,
    sim_config: SimConfig,
) -> None:
    """Title, data and the default agent and AI Task entity are the user flow's."""
    said = await load_script("seed_config").seed_entry(hass, sim.url)
    assert said == f"created llama.cpp on 127.0.0.1 ({sim_config.model}) for {sim.url}"
    seeded = copy.deepcopy(hass_storage[config_entries.STORAGE_KEY]["data"])
    (entry,) = [e for e in seeded["entries"] if e["domain"] == DOMAIN]

    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: sim.url}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_MODEL: sim_config.model}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert _shape(entry) == _shape(result["result"].as_dict())
    assert await hass.config_entries.async_unload(result["result"].entry_id)
