"""Config flow and reconfigure flow, against real HTTP servers.

The entry's other flows are tested beside this: reauth, options and subentry flows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from types import MappingProxyType
from typing import Any

from aiohttp import web
from homeassistant import config_entries
from homeassistant.config_entries import (
    SIGNAL_CONFIG_ENTRY_CHANGED,
    ConfigEntry,
    ConfigEntryChange,
    ConfigEntryState,
    ConfigSubentry,
)
from homeassistant.const import CONF_API_KEY, CONF_NAME, CONF_URL
from homeassistant.core import HomeAssistant, callback
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import device_registry as dr, entity_registry as er
from homeassistant.helpers.dispatcher import async_dispatcher_connect
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.config_flow import URL_EXAMPLE
from custom_components.llm_lanes.const import (
    CONF_KIND,
    CONF_LANE,
    CONF_MODEL,
    DOMAIN,
    SUBENTRY_AI_TASK,
    SUBENTRY_CLIENT,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.gateway.clients import find_client, new_api_key
from tools.simulator.server import SimConfig, SimulatedServer

from .support.entries import async_start_subentry_flow
from .support.llamacpp import free_port

type Routes = dict[str, Callable[[web.Request], Any]]


@pytest.fixture
async def http_server(socket_enabled: None) -> AsyncIterator[Callable[[Routes], Any]]:
    """Start small real HTTP servers that answer only the given GET routes (404 elsewhere)."""
    runners: list[web.AppRunner] = []

    async def start(routes: Routes) -> str:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_get(path, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def _start_user_flow(hass: HomeAssistant) -> str:
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "user"
    return str(result["flow_id"])


@pytest.mark.usefixtures("ha_core")
async def test_user_flow_creates_entry_with_agents(
    hass: HomeAssistant, sim: SimulatedServer, sim_config: SimConfig
) -> None:
    """URL -> detection -> model; the entry gets a conversation agent and an AI Task entity."""
    flow_id = await _start_user_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_URL: sim.url + "/"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "model"
    assert result["description_placeholders"]["kind"] == "llama.cpp"

    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_MODEL: sim_config.model}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == {
        CONF_URL: sim.url,
        CONF_KIND: "llama_cpp",
        CONF_MODEL: sim_config.model,
    }
    entry = result["result"]
    assert entry.unique_id == f"llama_cpp@127.0.0.1:{sim.port}"
    assert entry.title == f"llama.cpp on 127.0.0.1 ({sim_config.model})"
    assert sorted((s.subentry_type, s.title) for s in entry.subentries.values()) == [
        (SUBENTRY_AI_TASK, "llama.cpp on 127.0.0.1"),
        (SUBENTRY_CONVERSATION, "llama.cpp on 127.0.0.1"),
    ]
    await hass.async_block_till_done()
    # Their devices are named after the server, their entities say what they are.
    for entity_id, name in (
        ("conversation.llama_cpp_on_127_0_0_1_conversation", "Conversation"),
        ("ai_task.llama_cpp_on_127_0_0_1_ai_task", "AI Task"),
    ):
        state = hass.states.get(entity_id)
        assert state is not None
        assert state.name == f"llama.cpp on 127.0.0.1 {name}"
    # Each device says what it is and which server: none is taken for another.
    devices = dr.async_entries_for_config_entry(dr.async_get(hass), entry.entry_id)
    assert {device.name for device in devices} == {
        f"llama.cpp on 127.0.0.1 ({sim_config.model})",
        "llama.cpp on 127.0.0.1 Conversation",
        "llama.cpp on 127.0.0.1 AI Task",
    }
    assert await hass.config_entries.async_unload(entry.entry_id)


@pytest.mark.usefixtures("ha_core")
async def test_two_servers_can_be_told_apart(
    hass: HomeAssistant, sim: SimulatedServer, sim_config: SimConfig
) -> None:
    """Two servers of the same kind and model: titles, agents and entity ids all differ.

    Both run on 127.0.0.1 here, so the second one's names carry its port.
    """
    async with SimulatedServer(SimConfig(slots=1, model=sim_config.model)) as second:
        entries = [
            await _create_entry(hass, url, sim_config.model)
            for url in (sim.url, second.url)
        ]
        assert [entry.title for entry in entries] == [
            f"llama.cpp on 127.0.0.1 ({sim_config.model})",
            f"llama.cpp on 127.0.0.1:{second.port} ({sim_config.model})",
        ]
        agents = {
            registry_entry.entity_id
            for entry in entries
            for registry_entry in er.async_entries_for_config_entry(
                er.async_get(hass), entry.entry_id
            )
            if registry_entry.domain in {"conversation", "ai_task"}
        }
        assert agents == {
            "ai_task.llama_cpp_on_127_0_0_1_ai_task",
            f"ai_task.llama_cpp_on_127_0_0_1_{second.port}_ai_task",
            "conversation.llama_cpp_on_127_0_0_1_conversation",
            f"conversation.llama_cpp_on_127_0_0_1_{second.port}_conversation",
        }
        goodput = {
            state.entity_id
            for state in hass.states.async_all("sensor")
            if state.entity_id.endswith("_goodput")
        }
        assert goodput == {
            "sensor.llama_cpp_on_127_0_0_1_sim_llama_8b_goodput",
            f"sensor.llama_cpp_on_127_0_0_1_{second.port}_sim_llama_8b_goodput",
        }

        # An agent added later is named after its server too.
        result = await async_start_subentry_flow(
            hass, entries[1], SUBENTRY_CONVERSATION
        )
        name = next(key for key in result["data_schema"].schema if key == CONF_NAME)
        assert name.default() == f"llama.cpp on 127.0.0.1:{second.port}"
        for entry in entries:
            assert await hass.config_entries.async_unload(entry.entry_id)


@pytest.mark.usefixtures("ha_core")
async def test_user_flow_keeps_api_key(
    hass: HomeAssistant, sim: SimulatedServer, sim_config: SimConfig
) -> None:
    """An API key given in the form is stored with the entry (stripped)."""
    flow_id = await _start_user_flow(hass)
    await hass.config_entries.flow.async_configure(
        flow_id, {CONF_URL: sim.url, CONF_API_KEY: " secret "}
    )
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_MODEL: sim_config.model}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"][CONF_API_KEY] == "secret"


@pytest.mark.usefixtures("ha_core")
async def test_user_flow_errors_then_recovers(
    hass: HomeAssistant,
    sim: SimulatedServer,
    sim_config: SimConfig,
    http_server: Callable[[Routes], Any],
) -> None:
    """Each failure shows its error in the form; a good URL then goes through."""

    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response({"error": "invalid api key"}, status=401)

    async def version(_request: web.Request) -> web.Response:
        return web.json_response({"version": "0.12.6"})

    async def no_tags(_request: web.Request) -> web.Response:
        return web.json_response({"models": []})

    async def router_page(_request: web.Request) -> web.Response:
        return web.Response(text="<html>router</html>")

    unsupported = await http_server({"/": router_page})
    auth = await http_server(
        {"/api/version": refuse, "/props": refuse, "/v1/models": refuse}
    )
    empty = await http_server(
        {"/api/version": version, "/api/tags": no_tags, "/api/ps": no_tags}
    )

    flow_id = await _start_user_flow(hass)
    closed = f"http://127.0.0.1:{free_port()}"
    cases = [
        ({CONF_URL: "not a url"}, {CONF_URL: "invalid_url"}),
        ({CONF_URL: "ftp://example.org"}, {CONF_URL: "invalid_url"}),
        ({CONF_URL: "http://[broken"}, {CONF_URL: "invalid_url"}),
        ({CONF_URL: closed + "/"}, {"base": "cannot_connect"}),
        ({CONF_URL: unsupported}, {"base": "unsupported_server"}),
        ({CONF_URL: auth, CONF_API_KEY: "wrong"}, {"base": "invalid_auth"}),
        ({CONF_URL: empty}, {"base": "no_models"}),
    ]
    for user_input, errors in cases:
        result = await hass.config_entries.flow.async_configure(flow_id, user_input)
        assert result["type"] is FlowResultType.FORM, user_input
        assert result["errors"] == errors, user_input
        if errors == {"base": "cannot_connect"}:
            # The error names the URL tried (and says what to check there).
            assert result["description_placeholders"] == {
                CONF_URL: closed,
                **URL_EXAMPLE,
            }

    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_URL: sim.url}
    )
    assert result["step_id"] == "model"
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_MODEL: sim_config.model}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY


@pytest.mark.usefixtures("ha_core")
async def test_same_server_aborts(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, sim: SimulatedServer
) -> None:
    """The unique id comes from the server: a second entry for it aborts."""
    mock_config_entry.add_to_hass(hass)
    flow_id = await _start_user_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_URL: sim.url}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


@pytest.mark.usefixtures("ha_core")
@pytest.mark.parametrize("typed", ["{url}/v1", "{url}/v1/"])
async def test_user_flow_stores_the_url_without_v1(
    hass: HomeAssistant, sim: SimulatedServer, sim_config: SimConfig, typed: str
) -> None:
    """``/v1`` (an OpenAI-compatible API's path) is not part of the server's URL or identity."""
    flow_id = await _start_user_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_URL: typed.format(url=sim.url)}
    )
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_MODEL: sim_config.model}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"][CONF_URL] == sim.url
    assert result["result"].unique_id == f"llama_cpp@127.0.0.1:{sim.port}"
    assert await hass.config_entries.async_unload(result["result"].entry_id)


@pytest.mark.usefixtures("ha_core")
@pytest.mark.parametrize(
    ("stored", "typed"), [("", "/v1"), ("/v1", ""), ("/v1", "/v1/")]
)
async def test_same_server_with_or_without_v1_aborts(
    hass: HomeAssistant,
    sim: SimulatedServer,
    sim_config: SimConfig,
    stored: str,
    typed: str,
) -> None:
    """An entry stored with ``/v1`` (and its unique id) or without is the same server."""
    MockConfigEntry(
        domain=DOMAIN,
        data={CONF_URL: sim.url + stored, CONF_KIND: "llama_cpp", CONF_MODEL: "m"},
        unique_id=f"llama_cpp@127.0.0.1:{sim.port}{stored}",
    ).add_to_hass(hass)
    flow_id = await _start_user_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_URL: sim.url + typed}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


@pytest.mark.usefixtures("ha_core")
async def test_reconfigure_changes_the_key(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, sim: SimulatedServer
) -> None:
    """Reconfigure sets and removes the key of the same server; a bad URL shows its error.

    The entry is not loaded, so the flow itself has it set up with the new data.
    """
    mock_config_entry.add_to_hass(hass)
    result = await mock_config_entry.start_reconfigure_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reconfigure"
    assert result["description_placeholders"]["kind"] == "llama.cpp"

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: "nope"}
    )
    assert result["errors"] == {CONF_URL: "invalid_url"}
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: sim.url, CONF_API_KEY: "k"}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert mock_config_entry.data[CONF_API_KEY] == "k"
    await hass.async_block_till_done()
    assert mock_config_entry.state is ConfigEntryState.LOADED

    result = await mock_config_entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: sim.url}
    )
    assert result["reason"] == "reconfigure_successful"
    assert CONF_API_KEY not in mock_config_entry.data
    await hass.async_block_till_done()
    assert mock_config_entry.runtime_data.backend.base_url == sim.url
    assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


def _reloads(hass: HomeAssistant, entry: MockConfigEntry) -> list[ConfigEntryState]:
    """Record the states the entry goes through from now on (one NOT_LOADED per reload)."""
    states: list[ConfigEntryState] = []

    @callback
    def changed(change: ConfigEntryChange, changed_entry: ConfigEntry) -> None:
        if changed_entry.entry_id == entry.entry_id and (
            not states or states[-1] is not changed_entry.state
        ):
            states.append(changed_entry.state)

    async_dispatcher_connect(hass, SIGNAL_CONFIG_ENTRY_CHANGED, changed)
    return states


@pytest.mark.usefixtures("ha_core")
async def test_reconfigure_moves_the_server(
    hass: HomeAssistant, sim: SimulatedServer, sim_config: SimConfig
) -> None:
    """A server at a new address keeps its entry, agents and entities; default names follow it.

    Tests may only reach 127.0.0.1, so the server moves to another port there; a neighbour on
    the same host makes the names carry the port.
    """
    model = sim_config.model
    async with (
        SimulatedServer(SimConfig(slots=1, model="neighbour")) as neighbour,
        SimulatedServer(SimConfig(slots=2, speed=50.0, model=model)) as moved,
    ):
        neighbour_entry = await _create_entry(hass, neighbour.url, "neighbour")
        assert neighbour_entry.title == "llama.cpp on 127.0.0.1 (neighbour)"
        entry = await _create_entry(hass, sim.url, model)
        assert entry.title == f"llama.cpp on 127.0.0.1:{sim.port} ({model})"
        entity_ids = _entity_ids(hass, entry)
        subentry_ids = set(entry.subentries)
        # The AI Task entity the user renamed keeps its name.
        renamed = next(
            s for s in entry.subentries.values() if s.subentry_type == SUBENTRY_AI_TASK
        )
        hass.config_entries.async_update_subentry(entry, renamed, title="Kitchen tasks")
        await hass.async_block_till_done()
        states = _reloads(hass, entry)

        await _async_move(hass, entry, moved.url)
        assert entry.unique_id == f"llama_cpp@127.0.0.1:{moved.port}"
        assert entry.title == f"llama.cpp on 127.0.0.1:{moved.port} ({model})"
        assert set(entry.subentries) == subentry_ids
        assert {s.title for s in entry.subentries.values()} == {
            f"llama.cpp on 127.0.0.1:{moved.port}",
            "Kitchen tasks",
        }
        # Reloaded once, from the update listener, for the three changes.
        assert states.count(ConfigEntryState.NOT_LOADED) == 1
        assert states[-1] is ConfigEntryState.LOADED
        assert entry.runtime_data.backend.base_url == moved.url
        assert entry.runtime_data.server.last_update_success
        assert _entity_ids(hass, entry) == entity_ids

        # The old address is free again: a new entry for it is no duplicate.
        flow_id = await _start_user_flow(hass)
        result = await hass.config_entries.flow.async_configure(
            flow_id, {CONF_URL: sim.url}
        )
        assert result["step_id"] == "model"
        for loaded in (entry, neighbour_entry):
            assert await hass.config_entries.async_unload(loaded.entry_id)


@pytest.mark.usefixtures("ha_core")
async def test_reconfigure_moves_a_server_with_a_client(
    hass: HomeAssistant, sim: SimulatedServer, sim_config: SimConfig
) -> None:
    """A gateway client keeps its name and key when its server moves (only agents are renamed)."""
    entry = await _create_entry(hass, sim.url, sim_config.model)
    api_key = new_api_key()
    client = ConfigSubentry(
        data=MappingProxyType({CONF_LANE: "interactive", CONF_API_KEY: api_key}),
        subentry_type=SUBENTRY_CLIENT,
        title="Open WebUI",
        unique_id=None,
    )
    hass.config_entries.async_add_subentry(entry, client)
    await hass.async_block_till_done()
    async with SimulatedServer(SimConfig(slots=2, model=sim_config.model)) as moved:
        await _async_move(hass, entry, moved.url)
        titles = {s.subentry_type: s.title for s in entry.subentries.values()}
        assert titles == {
            SUBENTRY_CONVERSATION: "llama.cpp on 127.0.0.1",
            SUBENTRY_AI_TASK: "llama.cpp on 127.0.0.1",
            SUBENTRY_CLIENT: "Open WebUI",
        }
        found = find_client(hass, api_key)
        assert found is not None
        assert found[0] is entry
        assert found[1].subentry_id == client.subentry_id
        assert await hass.config_entries.async_unload(entry.entry_id)


def _entity_ids(hass: HomeAssistant, entry: ConfigEntry) -> set[str]:
    return {
        registry_entry.entity_id
        for registry_entry in er.async_entries_for_config_entry(
            er.async_get(hass), entry.entry_id
        )
    }


@pytest.mark.usefixtures("ha_core")
async def test_reconfigure_refuses_another_kind_or_a_configured_server(
    hass: HomeAssistant, sim: SimulatedServer, sim_config: SimConfig
) -> None:
    """An Ollama at the new address is not this llama.cpp; another entry's server is taken."""
    entry = await _create_entry(hass, sim.url, sim_config.model)
    async with (
        SimulatedServer(SimConfig(kind="ollama")) as ollama,
        SimulatedServer(SimConfig(slots=1)) as other,
    ):
        other_entry = await _create_entry(hass, other.url, sim_config.model)
        result = await _start_reconfigure_flow(hass, entry)
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {CONF_URL: ollama.url}
        )
        assert result["type"] is FlowResultType.FORM
        assert result["errors"] == {"base": "wrong_server_kind"}
        assert result["description_placeholders"] == {
            CONF_URL: ollama.url,
            "kind": "llama.cpp",
            "found": "Ollama",
            **URL_EXAMPLE,
        }

        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {CONF_URL: other.url}
        )
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "already_configured"
        assert entry.data[CONF_URL] == sim.url
        for loaded in (entry, other_entry):
            assert await hass.config_entries.async_unload(loaded.entry_id)


async def _start_reconfigure_flow(
    hass: HomeAssistant, entry: ConfigEntry
) -> config_entries.ConfigFlowResult:
    return await hass.config_entries.flow.async_init(
        DOMAIN,
        context={
            "source": config_entries.SOURCE_RECONFIGURE,
            "entry_id": entry.entry_id,
        },
    )


async def _async_move(hass: HomeAssistant, entry: ConfigEntry, url: str) -> None:
    """Move the entry to the server at ``url`` through the reconfigure flow; let it reload."""
    result = await _start_reconfigure_flow(hass, entry)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: url}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    await hass.async_block_till_done()
    assert entry.data[CONF_URL] == url


async def _create_entry(hass: HomeAssistant, url: str, model: str) -> ConfigEntry:
    """Add the server at ``url`` through the user flow (it is set up); return its entry."""
    flow_id = await _start_user_flow(hass)
    await hass.config_entries.flow.async_configure(flow_id, {CONF_URL: url})
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_MODEL: model}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    entry: ConfigEntry = result["result"]
    assert entry.state is ConfigEntryState.LOADED
    return entry
