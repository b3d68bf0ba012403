"""Write what ``scripts/develop`` stores in a config folder before Home Assistant starts.

All four go through Home Assistant's own storage classes, in the format it loads at start:

- the HTTP server (host and port): Home Assistant 2026.10 keeps it in ``.storage/http`` (what
  *Settings → System → Network* edits) and raises a repair for an ``http:`` block in YAML;
- onboarding's core-config step marked done: ``configuration.yaml`` already holds the core config,
  and that step is the one that sets up Google Translate, Met.no and Radio Browser, which fail with
  no internet (the owner account is still created in the UI);
- with a URL (and the API key it asks for), the LLM Lanes config entry (a conversation agent and
  an AI Task subentry) against the server at that URL, unless the folder has one for it, after
  asking it what it is with the integration's own probe (the config flow's check). When the folder already holds the entry made for the simulator (same kind and
  model, on this machine), only its URL is brought up to date (the simulator may run on another
  port this time);
- with the entry made, Assist's preferred assistant using its conversation agent (the pipeline's
  ``conversation_engine``), unless Home Assistant already keeps assistants in this folder.

    python scripts/lib/seed_config.py CONFIG_DIR HTTP_PORT [URL [API_KEY]]
"""

from __future__ import annotations

import asyncio
from pathlib import Path
import sys
from types import MappingProxyType
from urllib.parse import urlsplit

import aiohttp
from homeassistant import config_entries
from homeassistant.components.assist_pipeline.pipeline import (
    STORAGE_KEY as PIPELINE_STORAGE_KEY,
    STORAGE_VERSION as PIPELINE_STORAGE_VERSION,
    STORAGE_VERSION_MINOR as PIPELINE_STORAGE_VERSION_MINOR,
    Pipeline,
    PipelineStore,
)
from homeassistant.components.http.config import HTTP_STORAGE_SCHEMA, HTTPConfigStore
from homeassistant.components.http.const import (
    CONF_IP_BAN_ENABLED,
    CONF_SERVER_HOST,
    CONF_SERVER_PORT,
)
from homeassistant.components.onboarding import (
    STORAGE_KEY as ONBOARDING_STORAGE_KEY,
    STORAGE_VERSION as ONBOARDING_STORAGE_VERSION,
    OnboardingStorage,
)
from homeassistant.components.onboarding.const import STEP_CORE_CONFIG
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.helpers.storage import Store
from homeassistant.util import ulid as ulid_util

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from custom_components.llm_lanes.backend_setup import normalize_url, probe_server  # noqa: E402
from custom_components.llm_lanes.config_flow import LLMLanesConfigFlow  # noqa: E402
from custom_components.llm_lanes.const import CONF_KIND, CONF_MODEL, DOMAIN  # noqa: E402
from custom_components.llm_lanes.entry_defaults import (  # noqa: E402
    default_agent_entity_id,
    default_subentries,
    entry_title,
    server_name,
)

HTTP_HOST = "127.0.0.1"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


async def seed_http(hass: HomeAssistant, port: int) -> None:
    """Serve on HTTP_HOST:port, as if set in Settings → System → Network and confirmed.

    IP bans are off: on loopback they could only ban the developer. With them on, the onboarding
    page's first request (its installation type, which Home Assistant refuses once any step is
    done, here the core config) is logged as a failed login and raises a notification.
    """
    store = HTTPConfigStore(hass)
    await store.async_set_pending(
        HTTP_STORAGE_SCHEMA(
            {
                CONF_SERVER_HOST: [HTTP_HOST],
                CONF_SERVER_PORT: port,
                CONF_IP_BAN_ENABLED: False,
            }
        )
    )
    if store.pending is not None:
        await store.async_promote_pending()
    await store.async_mark_yaml_migration_done()


async def seed_onboarding(hass: HomeAssistant) -> None:
    """Mark onboarding's core-config step done (configuration.yaml holds the core config)."""
    store = OnboardingStorage(
        hass, ONBOARDING_STORAGE_VERSION, ONBOARDING_STORAGE_KEY, private=True
    )
    data = await store.async_load() or {"done": []}
    if STEP_CORE_CONFIG not in data["done"]:
        data["done"].append(STEP_CORE_CONFIG)
        await store.async_save(data)


async def seed_entry(hass: HomeAssistant, url: str, api_key: str | None = None) -> str:
    """Write the entry unless one exists; return what happened.

    The URL is written as the config flow writes it (``normalize_url``: no ``/v1``).
    """
    url = normalize_url(url)
    store: Store[dict[str, list[dict[str, object]]]] = Store(
        hass,
        config_entries.STORAGE_VERSION,
        config_entries.STORAGE_KEY,
        minor_version=config_entries.STORAGE_VERSION_MINOR,
    )
    stored = await store.async_load() or {"entries": []}
    async with aiohttp.ClientSession() as session:
        probed = await probe_server(session, url, api_key)
    others: list[str] = []
    for existing in stored["entries"]:
        data = existing["data"]
        assert isinstance(data, dict)
        if existing.get("domain") == DOMAIN:
            others.append(str(data.get(CONF_URL)))
        if (
            existing.get("domain") == DOMAIN
            and existing.get("unique_id") == probed.info.unique_id
        ):
            return f"{existing['title']} already set up for {url}"
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
            return result
    model = (
        probed.info.loaded_models[0]
        if probed.info.loaded_models
        else probed.info.models[0]
    )
    # Named and filled as the config flow does it (the model step's defaults).
    name = server_name(probed.kind, url, others)
    entry_data = {CONF_URL: url, CONF_KIND: probed.kind.value, CONF_MODEL: model}
    if api_key:
        entry_data[CONF_API_KEY] = api_key
    entry = config_entries.ConfigEntry(
        data=entry_data,
        discovery_keys=MappingProxyType({}),
        domain=DOMAIN,
        minor_version=LLMLanesConfigFlow.MINOR_VERSION,
        options={},
        source=config_entries.SOURCE_USER,
        subentries_data=default_subentries(name, model),
        title=entry_title(name, model),
        unique_id=probed.info.unique_id,
        version=LLMLanesConfigFlow.VERSION,
    )
    stored["entries"].append(entry.as_dict())
    await store.async_save(stored)
    agent = default_agent_entity_id(name)
    assist = f", Assist answered by {agent}" if await seed_assist(hass, agent) else ""
    return f"created {entry.title} for {url}{assist}"


async def seed_assist(hass: HomeAssistant, agent: str) -> bool:
    """Make Assist's preferred assistant use ``agent``, unless assistants are stored already.

    The assistant is the one Home Assistant would make on its first start ("Home Assistant", no
    speech engines in this configuration) but for its conversation agent. Return whether it was
    written.
    """
    store = PipelineStore(
        hass,
        PIPELINE_STORAGE_VERSION,
        PIPELINE_STORAGE_KEY,
        minor_version=PIPELINE_STORAGE_VERSION_MINOR,
    )
    if await store.async_load() is not None:
        return False
    pipeline = Pipeline(
        conversation_engine=agent,
        conversation_language="en",
        language="en",
        name="Home Assistant",
        stt_engine=None,
        stt_language=None,
        tts_engine=None,
        tts_language=None,
        tts_voice=None,
        wake_word_entity=None,
        wake_word_id=None,
        id=ulid_util.ulid_now(),
    )
    await store.async_save(
        {"items": [pipeline.to_json()], "preferred_item": pipeline.id}
    )
    return True


async def seed(
    config_dir: Path, http_port: int, url: str | None, api_key: str | None = None
) -> None:
    """Write the HTTP server, onboarding's state and (with a URL) the entry."""
    hass = HomeAssistant(str(config_dir))
    await seed_http(hass, http_port)
    await seed_onboarding(hass)
    if url is not None:
        print(await seed_entry(hass, url, api_key), flush=True)
    await hass.async_stop(force=True)


def run(
    config_dir: Path, http_port: int, url: str | None, api_key: str | None = None
) -> None:
    """Seed a config folder (what the command line does)."""
    asyncio.run(seed(config_dir, http_port, url, api_key))


def main() -> int:
    """Seed the config folder named on the command line."""
    config_dir, http_port = Path(sys.argv[1]), int(sys.argv[2])
    url = sys.argv[3] if len(sys.argv) > 3 else None
    run(config_dir, http_port, url, sys.argv[4] if len(sys.argv) > 4 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
