"""scripts/develop's entry is the one the config flow makes for the same server; Assist uses it.

Also what ``scripts/develop`` puts in a config folder besides: the files its configuration.yaml
includes (automations made in the UI, from the blueprints too, are kept) and the blueprints.
"""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

from homeassistant import config as conf_util, config_entries
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.setup import async_setup_component
import pytest

from custom_components.llm_lanes.const import CONF_MODEL, DOMAIN
from tools.simulator.server import SimConfig, SimulatedServer

from .support.scripts import SCRIPTS, load_script


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
    seed_config = load_script("seed_config")
    said = await seed_config.seed_entry(hass, sim.url)
    agent = "conversation.llama_cpp_on_127_0_0_1_conversation"
    assert said == (
        f"created llama.cpp on 127.0.0.1 ({sim_config.model}) for {sim.url}, "
        f"Assist answered by {agent}"
    )
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
    # Assist's preferred assistant answers with the agent the entry makes.
    pipelines = hass_storage["assist_pipeline.pipelines"]["data"]
    (preferred,) = [
        item for item in pipelines["items"] if item["id"] == pipelines["preferred_item"]
    ]
    assert preferred["conversation_engine"] == agent
    state = hass.states.get(agent)
    assert state is not None
    assert state.name == "llama.cpp on 127.0.0.1 Conversation"
    # Assistants Home Assistant keeps already are left as they are.
    assert not await seed_config.seed_assist(hass, "conversation.other")
    assert await hass.config_entries.async_unload(result["result"].entry_id)


async def test_develop_keeps_what_the_ui_makes(
    hass: HomeAssistant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configuration.yaml includes automations, scripts and scenes, in files made for them.

    An automation made in the UI (from a blueprint too) is written to automations.yaml, which
    Home Assistant then loads; the blueprints are where *Settings → Blueprints* lists them.
    """
    monkeypatch.syspath_prepend(str(SCRIPTS))
    instance = importlib.import_module("dev_instance").DevInstance(tmp_path)
    instance.prepare()
    hass.config.config_dir = str(tmp_path)
    config = await conf_util.async_hass_config_yaml(hass)
    assert {"automation", "script", "scene"} <= set(config)
    assert (tmp_path / "automations.yaml").read_text() == "[]\n"
    # Found as Home Assistant's blueprint loader finds them (a glob, which follows no link),
    # beside the examples Home Assistant puts in a folder it makes.
    found = {
        str(path.relative_to(tmp_path / "blueprints/automation"))
        for path in (tmp_path / "blueprints/automation").glob("**/*.yaml")
    }
    assert {
        "llm_lanes/llm_slow_pause_background.yaml",
        "llm_lanes/nightly_digest_to_phone.yaml",
        "homeassistant/motion_light.yaml",
    } <= found

    (tmp_path / "automations.yaml").write_text(
        "- id: '1'\n  alias: Made in the UI\n  triggers: []\n  actions: []\n"
    )
    assert await async_setup_component(
        hass, "automation", await conf_util.async_hass_config_yaml(hass)
    )
    await hass.async_block_till_done()
    assert hass.states.get("automation.made_in_the_ui") is not None


def _dev_instance(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("dev_instance")


def test_develop_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The simulator and its entry by default; your own server, or none, in any folder."""
    dev_instance = _dev_instance(monkeypatch)

    def instance(*argv: str) -> Any:
        return dev_instance.instance_from_args(dev_instance.parse_args(list(argv)))

    default = instance()
    assert default.config_dir == SCRIPTS.parents[1] / "config"
    assert default.simulated
    assert default.entry_url == default.sim_url

    empty = instance("--empty", "--config", str(tmp_path))
    assert empty.config_dir == tmp_path
    assert not empty.simulated
    assert empty.entry_url is None

    own = instance("--server", "http://192.168.1.20:8080", "--api-key", "secret")
    assert not own.simulated
    assert (own.entry_url, own.api_key) == ("http://192.168.1.20:8080", "secret")

    # The browser test adds the simulator's entry through the UI: the simulator runs, no entry.
    for_the_ui = dev_instance.DevInstance(tmp_path, seed_entry=False)
    assert for_the_ui.simulated
    assert for_the_ui.entry_url is None

    for wrong in (["--empty", "--server", "http://a:1"], ["--api-key", "secret"]):
        with pytest.raises(SystemExit):
            dev_instance.parse_args(wrong)


def test_develop_links_this_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another checkout's link is replaced; an installed copy is left alone, and said so."""
    dev_instance = _dev_instance(monkeypatch)
    link = tmp_path / "custom_components" / "llm_lanes"
    link.parent.mkdir()
    link.symlink_to(tmp_path)
    dev_instance.DevInstance(tmp_path).prepare()
    assert link.resolve() == SCRIPTS.parents[1] / "custom_components" / "llm_lanes"

    installed = tmp_path / "installed"
    (installed / "custom_components" / "llm_lanes").mkdir(parents=True)
    with pytest.raises(SystemExit, match="installed copy"):
        dev_instance.DevInstance(installed).prepare()
    assert not (installed / "custom_components" / "llm_lanes").is_symlink()


@pytest.mark.usefixtures("ha_core")
async def test_develop_seeds_your_server_with_its_key(
    hass: HomeAssistant, hass_storage: dict[str, Any], sim: SimulatedServer
) -> None:
    """``--server URL --api-key KEY``: the URL as the flow stores it (no ``/v1``), the key; once."""
    seed_config = load_script("seed_config")
    said = await seed_config.seed_entry(hass, sim.url + "/v1", "secret")
    assert said.startswith("created ")
    (entry,) = [
        e
        for e in hass_storage[config_entries.STORAGE_KEY]["data"]["entries"]
        if e["domain"] == DOMAIN
    ]
    assert entry["data"][CONF_URL] == sim.url
    assert entry["data"][CONF_API_KEY] == "secret"
    assert await seed_config.seed_entry(hass, sim.url, "secret") == (
        f"{entry['title']} already set up for {sim.url}"
    )
