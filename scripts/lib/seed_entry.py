"""Create the LLM Lanes config entry of ``scripts/develop`` against a running server.

It asks the server what it is with the integration's own probe (the config flow's check), then
stores a config entry (with a conversation agent and an AI Task subentry) through Home Assistant's
own ``ConfigEntry`` and ``Store`` classes, in the format Home Assistant loads at start. When the
config folder already holds the entry made for the simulator (same kind and model, on this
machine), only its URL is brought up to date (the simulator may run on another port this time).

    python scripts/lib/seed_entry.py CONFIG_DIR URL
"""

from __future__ import annotations

import asyncio
from pathlib import Path
import sys
from types import MappingProxyType
from urllib.parse import urlsplit

import aiohttp
from homeassistant import config_entries
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm
from homeassistant.helpers.storage import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from custom_components.llm_lanes.backend_setup import probe_server  # noqa: E402
from custom_components.llm_lanes.const import (  # noqa: E402
    CONF_KIND,
    CONF_LLM_HASS_API,
    CONF_MODEL,
    DEFAULT_AI_TASK_NAME,
    DEFAULT_CONVERSATION_NAME,
    DOMAIN,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.entity import SERVER_KIND_NAMES  # noqa: E402

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


async def seed(config_dir: Path, url: str) -> str:
    """Write the entry unless one exists; return what happened."""
    hass = HomeAssistant(str(config_dir))
    store: Store[dict[str, list[dict[str, object]]]] = Store(
        hass,
        config_entries.STORAGE_VERSION,
        config_entries.STORAGE_KEY,
        minor_version=config_entries.STORAGE_VERSION_MINOR,
    )
    stored = await store.async_load() or {"entries": []}
    async with aiohttp.ClientSession() as session:
        probed = await probe_server(session, url, None)
    for existing in stored["entries"]:
        data = existing["data"]
        assert isinstance(data, dict)
        # The entry this script made for the simulator on an earlier start, maybe on another port.
        if (
            existing.get("domain") == DOMAIN
            and data.get(CONF_KIND) == probed.kind.value
            and data.get(CONF_MODEL) in probed.info.models
            and urlsplit(str(data.get(CONF_URL))).hostname in LOOPBACK
        ):
            if data[CONF_URL] == url:
                result = f"{existing['title']} already set up for {url}"
            else:
                data[CONF_URL] = url
                existing["unique_id"] = probed.info.unique_id
                await store.async_save(stored)
                result = f"{existing['title']} now points at {url}"
            await hass.async_stop(force=True)
            return result
    model = (
        probed.info.loaded_models[0]
        if probed.info.loaded_models
        else probed.info.models[0]
    )
    entry = config_entries.ConfigEntry(
        data={CONF_URL: url, CONF_KIND: probed.kind.value, CONF_MODEL: model},
        discovery_keys=MappingProxyType({}),
        domain=DOMAIN,
        minor_version=1,
        options={},
        source=config_entries.SOURCE_USER,
        subentries_data=[
            {
                "subentry_type": SUBENTRY_CONVERSATION,
                "data": {CONF_MODEL: model, CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]},
                "title": DEFAULT_CONVERSATION_NAME,
                "unique_id": None,
            },
            {
                "subentry_type": SUBENTRY_AI_TASK,
                "data": {CONF_MODEL: model},
                "title": DEFAULT_AI_TASK_NAME,
                "unique_id": None,
            },
        ],
        title=f"{SERVER_KIND_NAMES[probed.kind]} ({model})",
        unique_id=probed.info.unique_id,
        version=1,
    )
    stored["entries"].append(entry.as_dict())
    await store.async_save(stored)
    await hass.async_stop(force=True)
    return f"created {entry.title} for {url}"


def main() -> int:
    """Seed the entry named on the command line."""
    config_dir, url = Path(sys.argv[1]), sys.argv[2]
    print(asyncio.run(seed(config_dir, url)))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
