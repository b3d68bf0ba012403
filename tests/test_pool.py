"""The household's pool in Home Assistant: two simulated servers as one.

A GPU box (the simulator at its real pace, so an answer lasts) and a mini PC (fast), each an LLM
Lanes entry whose options give its place in the pool (``tests/support/pool.py``): voice, typed
chats and automations prefer the GPU box, background runs there only. Agents and AI Task
entities set to the pool, the actions with ``pool``, the event, the pool sensors, the repair of a
lane without a server, and a GPU box asleep at start that a job's wake entity (a template button
whose action starts its simulator) wakes while voice goes to the mini PC.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import timedelta
import time

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant, ServiceCall
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er, issue_registry as ir
from homeassistant.setup import async_setup_component
from homeassistant.util import dt as dt_util
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_capture_events,
    async_fire_time_changed,
)

from custom_components.llm_lanes.const import (
    DOMAIN,
    EVENT_REQUEST_FINISHED,
    OPT_IDLE_SLEEP_MINUTES,
    OPT_POOL,
    OPT_SLEEP_ENTITY,
    OPT_WAKE_ENTITY,
)
from custom_components.llm_lanes.core.availability import ServerState
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.router import ANY_MODEL
from custom_components.llm_lanes.dashboard import dashboard_config
import custom_components.llm_lanes.household as household_module
from custom_components.llm_lanes.household import (
    TICK_INTERVAL,
    entity_action,
    household_of,
)
from custom_components.llm_lanes.pool_sensor import POOL_KEYS
from custom_components.llm_lanes.repairs import pool_lane_issue_id
from tools.simulator.server import SimulatedServer

from .support.entities import async_flush_snapshots, entity_id_for, state_of
from .support.entries import FAST_SIM, MODEL, REAL_SPEED_SIM, async_set_up
from .support.llamacpp import free_port
from .support.pool import (
    GPU_RANKS,
    WAKE_BUTTON,
    async_set_up_mini,
    async_set_up_sleeping_gpu,
    async_set_up_wake_button,
    async_voice_command,
    pool_member_entry,
    start_job,
)
from .support.requests import async_call_action, async_wait_for

GPU_AGENT = "conversation.gpu_agent"
MINI_AGENT = "conversation.mini_agent"


@dataclass
class Home:
    """The two servers, their entries and simulators."""

    gpu: MockConfigEntry
    mini: MockConfigEntry
    gpu_sim: SimulatedServer
    mini_sim: SimulatedServer


def _chat(text: str = "tell me about the house") -> ChatRequest:
    return ChatRequest(
        model=ANY_MODEL, messages=(ChatMessage(role="user", content=text),)
    )


@pytest.fixture
async def home(ha_core: HomeAssistant, socket_enabled: None) -> AsyncIterator[Home]:
    """Set up the GPU box (real pace) and the mini PC (fast), both in the pool."""
    hass = ha_core
    async with (
        SimulatedServer(REAL_SPEED_SIM) as gpu_sim,
        SimulatedServer(FAST_SIM) as mini_sim,
    ):
        gpu = await async_set_up(
            hass,
            pool_member_entry(
                gpu_sim.url, "GPU box", GPU_RANKS, model=MODEL, agent="GPU agent"
            ),
        )
        mini = await async_set_up_mini(hass, mini_sim.url)
        yield Home(gpu, mini, gpu_sim, mini_sim)
        for entry in (gpu, mini):
            if entry.state is ConfigEntryState.LOADED:
                assert await hass.config_entries.async_unload(entry.entry_id)


async def test_two_servers_are_one_pool(hass: HomeAssistant, home: Home) -> None:
    """Both servers join; voice goes to the preferred GPU box, reported once, with its server.

    The routes follow the ranks, the quota ledger is the household's, and each server's device
    shows the pool's sensors.
    """
    pool = household_of(hass)
    gpu_id, mini_id = home.gpu.entry_id, home.mini.entry_id
    assert [entry.entry_id for entry in pool.members] == [gpu_id, mini_id]
    assert pool.pool.route(Lane.VOICE) == (gpu_id, mini_id)
    assert pool.pool.route(Lane.BACKGROUND) == (gpu_id,)
    events = async_capture_events(hass, EVENT_REQUEST_FINISHED)

    assert await async_voice_command(hass, MINI_AGENT)
    await hass.async_block_till_done()
    (event,) = events  # the attempt on the GPU box's scheduler is not reported apart
    assert event.data["pool"] is True
    assert event.data["server"] == event.data["config_entry_id"] == gpu_id
    assert (event.data["lane"], event.data["failovers"]) == ("voice", 0)
    assert event.data["requester"] == "device:kitchen-satellite"

    # One ledger: the mini PC's scheduler sees what the requester used on the GPU box, while
    # its own snapshot (its token sensors) lists only the requesters it served.
    mini = home.mini.runtime_data.scheduler
    tokens = mini.quotas.used("device:kitchen-satellite", time.monotonic())
    assert tokens == event.data["prompt_tokens"] + event.data["output_tokens"]
    assert "device:kitchen-satellite" not in mini.snapshot().requesters

    answer = await async_call_action(
        hass,
        "generate",
        config_entry_id=mini_id,
        prompt="Say hello.",
        max_tokens=4,
        pool=True,
    )
    assert (answer["server"], answer["failovers"]) == (gpu_id, 0)

    await async_flush_snapshots(hass)
    for entry in (home.gpu, home.mini):
        assert state_of(hass, entry, "sensor", "pool_state") == "up"
        assert state_of(hass, entry, "sensor", "voice_pool_server") == "GPU box"
    assert state_of(hass, home.gpu, "sensor", "pool_requests_served") == "2"
    assert state_of(hass, home.mini, "sensor", "pool_requests_served") == "0"
    entity = hass.states.get(
        entity_id_for(hass, home.gpu, "sensor", "voice_pool_server")
    )
    assert entity is not None
    assert entity.attributes["options"] == ["GPU box", "Mini PC"]
    assert entity.attributes["friendly_name"] == "GPU box Voice server now"


async def test_a_server_that_stops_mid_answer_is_continued_on_the_other(
    hass: HomeAssistant, home: Home
) -> None:
    """The GPU box stops while it streams: the mini PC continues the answer, one stream.

    The event says where it resumed; the sensors count the failover and show voice going to
    the mini PC, and back to the GPU box once it answers again.
    """
    pool = household_of(hass)
    gpu_id, mini_id = home.gpu.entry_id, home.mini.entry_id
    events = async_capture_events(hass, EVENT_REQUEST_FINISHED)
    chunks = []
    request = replace(_chat(), max_tokens=120)
    async for chunk in pool.stream(
        request, lane=Lane.INTERACTIVE, requester="user:anna"
    ):
        chunks.append(chunk)
        if len(chunks) == 5:
            await home.gpu_sim.kill()
    # One stream: every token once (the simulator's answers end where its model says), the
    # last chunk's usage the whole answer's.
    assert chunks[-1].done and chunks[-1].usage is not None
    streamed = sum(chunk.output_tokens for chunk in chunks)
    assert chunks[-1].usage.output_tokens == streamed > 5
    assert len("".join(chunk.text for chunk in chunks).split()) == streamed
    await hass.async_block_till_done()
    (event,) = events
    assert (
        event.data["server"],
        event.data["failovers"],
        event.data["resumed_on"],
    ) == (
        mini_id,
        1,
        mini_id,
    )
    assert event.data["outcome"] == "ok"

    await async_flush_snapshots(hass)
    assert state_of(hass, home.gpu, "sensor", "pool_failovers") == "1"
    assert state_of(hass, home.mini, "sensor", "pool_requests_served") == "1"
    assert state_of(hass, home.gpu, "sensor", "pool_state") == "down"
    assert state_of(hass, home.gpu, "sensor", "voice_pool_server") == "Mini PC"
    assert await async_voice_command(hass, GPU_AGENT)
    await hass.async_block_till_done()
    assert events[-1].data["server"] == mini_id

    # Back on its port: the pool's probe finds it, and voice goes to it again.
    async with SimulatedServer(replace(home.gpu_sim.config, port=home.gpu_sim.port)):
        # A hang guard: the pool's probe comes every PROBE_S.
        async with asyncio.timeout(60):
            await async_wait_for(
                lambda: pool.state(gpu_id) is ServerState.UP, limit=100_000
            )
        assert await async_voice_command(hass, GPU_AGENT)
        await hass.async_block_till_done()
        assert events[-1].data["server"] == gpu_id
        assert await hass.config_entries.async_unload(home.gpu.entry_id)


async def test_a_lane_whose_every_server_is_down_raises_a_repair(
    hass: HomeAssistant, home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both servers down a while: a repair per lane they serve; cleared when one is back."""
    for entry, sim in ((home.gpu, home.gpu_sim), (home.mini, home.mini_sim)):
        await sim.stop()
        await entry.runtime_data.server.async_refresh()
    issues = ir.async_get(hass)
    voice = pool_lane_issue_id(Lane.VOICE)

    async def tick() -> None:
        async_fire_time_changed(hass, dt_util.utcnow() + TICK_INTERVAL)
        await hass.async_block_till_done()

    await tick()
    assert issues.async_get_issue(DOMAIN, voice) is None  # not after a moment
    monkeypatch.setattr(household_module, "LANE_DOWN_REPAIR_AFTER", timedelta(0))
    await tick()
    issue = issues.async_get_issue(DOMAIN, voice)
    assert issue is not None
    assert issue.translation_key == "pool_lane_down"
    assert issue.translation_placeholders == {
        "lane": "voice",
        "servers": "GPU box, Mini PC",
    }
    assert issues.async_get_issue(DOMAIN, pool_lane_issue_id(Lane.BACKGROUND))

    async with SimulatedServer(replace(home.mini_sim.config, port=home.mini_sim.port)):
        await home.mini.runtime_data.server.async_refresh()
        await tick()
        assert issues.async_get_issue(DOMAIN, voice) is None
        # Background runs on the GPU box only: still none for it.
        assert issues.async_get_issue(DOMAIN, pool_lane_issue_id(Lane.BACKGROUND))
        assert await hass.config_entries.async_unload(home.mini.entry_id)
    # A pool of one: its outage has its own repair.
    assert issues.async_get_issue(DOMAIN, pool_lane_issue_id(Lane.BACKGROUND)) is None


async def test_a_job_wakes_the_sleeping_box_while_voice_goes_to_the_awake_one(
    ha_core: HomeAssistant, socket_enabled: None
) -> None:
    """The GPU box sleeps at start: its entry is set up asleep, its job presses the wake button.

    The button's action starts the GPU box's simulator; the job waits for it and runs there.
    A voice command during the wait is answered by the mini PC at once.
    """
    hass = ha_core
    port = free_port()
    gpu_sim = SimulatedServer(replace(FAST_SIM, port=port))
    booted = asyncio.Event()

    async def boot(_call: ServiceCall) -> None:
        await booted.wait()  # the machine takes a while to come up
        await gpu_sim.start()

    await async_set_up_wake_button(hass, boot)
    async with SimulatedServer(FAST_SIM) as mini_sim:
        gpu = await async_set_up_sleeping_gpu(
            hass, f"http://127.0.0.1:{port}", GPU_RANKS, model=MODEL
        )
        mini = await async_set_up_mini(hass, mini_sim.url)
        try:
            pool = household_of(hass)
            assert pool.state(gpu.entry_id) is ServerState.ASLEEP
            events = async_capture_events(hass, EVENT_REQUEST_FINISHED)
            job = start_job(
                hass, gpu, "The front door opened twice; the heating ran all morning."
            )
            # A hang guard: the pool's probe comes every PROBE_S.
            async with asyncio.timeout(60):
                await async_wait_for(
                    lambda: pool.state(gpu.entry_id) is ServerState.WAKING,
                    limit=100_000,
                )
            assert hass.states.get(WAKE_BUTTON).state != "unknown"  # pressed

            # (Not hass.async_block_till_done: the button's press is a task it would wait for.)
            assert await async_voice_command(hass, GPU_AGENT)
            assert [e.data["server"] for e in events] == [mini.entry_id]
            assert not job.done()

            booted.set()
            async with asyncio.timeout(30):
                response = await job
            assert response["status"] == "done", response
            assert response["text"]
            assert pool.state(gpu.entry_id) is ServerState.UP
            await hass.async_block_till_done()
            assert events[-1].data["server"] == gpu.entry_id
            assert events[-1].data["lane"] == "background"
        finally:
            for entry in (gpu, mini):
                assert await hass.config_entries.async_unload(entry.entry_id)
            await gpu_sim.stop()


async def test_wake_and_sleep_entities_are_pressed_or_switched(
    ha_core: HomeAssistant,
) -> None:
    """A button is pressed to wake and to sleep; a switch turned on to wake, off to sleep."""
    hass = ha_core
    calls: list[str] = []

    async def note(call: ServiceCall) -> None:
        calls.append(call.service)

    for service in ("pressed", "on", "off"):
        hass.services.async_register("test", service, note)
    assert await async_setup_component(
        hass,
        "template",
        {
            "template": [
                {"button": [{"name": "PC", "press": [{"action": "test.pressed"}]}]},
                {
                    "switch": [
                        {
                            "name": "PC power",
                            "turn_on": [{"action": "test.on"}],
                            "turn_off": [{"action": "test.off"}],
                        }
                    ]
                },
            ]
        },
    )
    await hass.async_block_till_done()
    await entity_action(hass, "button.pc", wake=True)()
    await entity_action(hass, "button.pc", wake=False)()
    await entity_action(hass, "switch.pc_power", wake=True)()
    await entity_action(hass, "switch.pc_power", wake=False)()
    assert calls == ["pressed", "pressed", "on", "off"]


async def test_the_pool_options_in_the_options_flow(
    hass: HomeAssistant, home: Home
) -> None:
    """The *Several servers* section stores ranks and entities; the pool follows at once.

    Idle minutes without a sleep entity are refused, and nothing is stored.
    """
    entry = home.mini
    result = await hass.config_entries.options.async_init(entry.entry_id)
    assert result["type"] is FlowResultType.FORM
    base = {
        key: value
        for key, value in result["data_schema"]({}).items()
        if key != OPT_POOL
    }
    section = {
        "voice_rank": "1",
        "interactive_rank": "2",
        "automation_rank": "0",
        "background_rank": "3",
        OPT_WAKE_ENTITY: "button.mini_wake",
        OPT_IDLE_SLEEP_MINUTES: 30,
        "wake_limit_s": 60,
    }
    result = await hass.config_entries.options.async_configure(
        result["flow_id"], {**base, OPT_POOL: section}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "idle_sleep_without_entity"}
    assert OPT_WAKE_ENTITY not in entry.options[OPT_POOL]

    result = await hass.config_entries.options.async_configure(
        result["flow_id"],
        {**base, OPT_POOL: {**section, OPT_SLEEP_ENTITY: "switch.mini_power"}},
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert entry.options[OPT_POOL] == {
        "voice_rank": 1,
        "interactive_rank": 2,
        "automation_rank": 0,
        "background_rank": 3,
        OPT_WAKE_ENTITY: "button.mini_wake",
        OPT_SLEEP_ENTITY: "switch.mini_power",
        OPT_IDLE_SLEEP_MINUTES: 30,
        "wake_limit_s": 60.0,
    }
    await hass.async_block_till_done(wait_background_tasks=True)
    pool = household_of(hass)
    gpu_id, mini_id = home.gpu.entry_id, entry.entry_id
    # Equal ranks keep the order the servers were added in.
    assert pool.pool.route(Lane.VOICE) == (gpu_id, mini_id)
    assert pool.pool.route(Lane.AUTOMATION) == (gpu_id,)
    assert pool.pool.route(Lane.BACKGROUND) == (gpu_id, mini_id)
    assert pool.can_wake(mini_id)

    # The form shows what is stored.
    result = await hass.config_entries.options.async_init(entry.entry_id)
    (pool_section,) = (
        value.schema
        for key, value in result["data_schema"].schema.items()
        if key == OPT_POOL
    )
    shown = {
        str(key): key.default() for key in pool_section.schema if callable(key.default)
    }
    assert shown["automation_rank"] == "0"
    assert shown[OPT_IDLE_SLEEP_MINUTES] == 30
    hass.config_entries.options.async_abort(result["flow_id"])


async def test_one_server_alone_has_no_pool_sensors(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A single server: no pool sensors; its own requests are reported as before."""
    registry = er.async_get(hass)
    assert not [
        key
        for key in POOL_KEYS
        if registry.async_get_entity_id(
            "sensor", DOMAIN, f"{init_integration.entry_id}_{key}"
        )
    ]
    assert household_of(hass).is_member(init_integration.entry_id)


async def test_the_server_that_could_not_serve_is_passed_over(
    hass: HomeAssistant, home: Home
) -> None:
    """A model only the mini PC serves runs there, whatever the ranks (its capabilities)."""
    pool = household_of(hass)
    await home.mini_sim.restart(model="tiny-helper")
    await home.mini.runtime_data.server.async_refresh()
    await hass.async_block_till_done(wait_background_tasks=True)
    result = await pool.pool.generate(
        replace(_chat("hello"), model="tiny-helper", max_tokens=3),
        lane=Lane.VOICE,
        requester="user:anna",
    )
    assert result.finished.server == home.mini.entry_id


async def test_the_dashboard_shows_the_servers_side_by_side(
    hass: HomeAssistant, home: Home
) -> None:
    """A first view, *Servers*: a section per server, then where each lane goes now."""
    config = dashboard_config(hass, [home.gpu, home.mini])
    servers = config["views"][0]
    assert (servers["title"], servers["path"]) == ("Servers", "servers")
    assert [view["title"] for view in config["views"][1:]] == ["GPU box", "Mini PC"]
    gpu, mini, lanes = servers["sections"]
    for section, entry in ((gpu, home.gpu), (mini, home.mini)):
        assert section["cards"][0] == {"type": "heading", "heading": entry.title}
        tiles = {card["entity"] for card in section["cards"][1:]}
        for key in ("pool_state", "pool_requests_served", "pool_failovers"):
            assert entity_id_for(hass, entry, "sensor", key) in tiles
    assert [row["entity"] for row in lanes["cards"][1]["entities"]] == [
        entity_id_for(hass, home.gpu, "sensor", f"{lane.key}_pool_server")
        for lane in LANES
    ]
    assert lanes["cards"][2]["type"] == "history-graph"
    # Each server's state is its own row, named by the server (the sensors' own name is the
    # same on both: "State in the pool").
    assert lanes["cards"][2]["entities"] == [
        {
            "entity": entity_id_for(hass, entry, "sensor", "pool_state"),
            "name": entry.title,
        }
        for entry in (home.gpu, home.mini)
    ]
    # Every tab shows its title: a view with an icon shows the icon alone.
    assert all("icon" not in view for view in config["views"])
    # One server: no such view (its own, as before).
    assert [v["title"] for v in dashboard_config(hass, [home.gpu])["views"]] == [
        "GPU box"
    ]
