"""Sensors of an LLM server, checked after real requests against the simulated server."""

from __future__ import annotations

from typing import Any

from homeassistant.components.sensor import (
    ATTR_STATE_CLASS,
    SensorDeviceClass,
    SensorStateClass,
)
from homeassistant.const import (
    ATTR_DEVICE_CLASS,
    ATTR_FRIENDLY_NAME,
    ATTR_UNIT_OF_MEASUREMENT,
    PERCENTAGE,
    STATE_UNAVAILABLE,
    STATE_UNKNOWN,
    UnitOfTime,
)
from homeassistant.core import HomeAssistant, State
from homeassistant.helpers import device_registry as dr, entity_registry as er
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    mock_restore_cache,
    mock_restore_cache_with_extra_data,
)

from custom_components.llm_lanes import sensor as sensor_module
from custom_components.llm_lanes.const import DOMAIN, OPT_HEADROOM, OPT_MAX_SEQUENCES
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.sensor import ACTIVITY_SENSORS
from tools.simulator.server import SimConfig, SimulatedServer

from .support.entities import (
    async_flush_snapshots,
    async_set_options,
    entity_id_for,
    state_of,
)
from .support.entries import MODEL, async_set_up, server_entry
from .support.requests import async_generate, async_wait_for, chat


def _known_before_restart(
    hass: HomeAssistant, entry: MockConfigEntry, key: str, object_id: str
) -> None:
    """Add the entry and register its sensor ``key`` as a run before a restart left it."""
    entry.add_to_hass(hass)
    er.async_get(hass).async_get_or_create(
        "sensor",
        DOMAIN,
        f"{entry.entry_id}_{key}",
        config_entry=entry,
        suggested_object_id=object_id,
    )


def _value(hass: HomeAssistant, entry: MockConfigEntry, key: str) -> float:
    return float(state_of(hass, entry, "sensor", key))


@pytest.mark.usefixtures("entity_registry_enabled_by_default")
async def test_sensors_when_idle(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Right after set-up: nothing queued, no latency yet, what the server reports."""
    entry = init_integration

    for key in ("queue_depth", "in_flight", "rejected_requests", "preemptions"):
        assert state_of(hass, entry, "sensor", key) == "0"
    for lane in LANES:
        assert state_of(hass, entry, "sensor", f"{lane.key}_queue_depth") == "0"
        for figure in ("ttft_p50", "ttft_p95", "itl_p95", "e2e_p95"):
            assert (
                state_of(hass, entry, "sensor", f"{lane.key}_{figure}") == STATE_UNKNOWN
            )
    assert state_of(hass, entry, "sensor", "goodput") == STATE_UNKNOWN
    assert _value(hass, entry, "output_tokens_per_second") == 0
    assert _value(hass, entry, "prompt_tokens_per_second") == 0
    assert state_of(hass, entry, "sensor", "loaded_model") == MODEL
    assert _value(hass, entry, "kv_cache_usage") == 0


@pytest.mark.usefixtures("entity_registry_enabled_by_default")
async def test_lane_sensors_are_named_in_home_assistant_s_language(
    ha_core: HomeAssistant, mock_config_entry: MockConfigEntry
) -> None:
    """One translation per figure, the lane's translated name filling its ``{lane}``."""
    hass = ha_core
    hass.config.language = "fr"
    entry = await async_set_up(hass, mock_config_entry)
    names = {
        lane.key: hass.states.get(
            entity_id_for(hass, entry, "sensor", f"{lane.key}_ttft_p95")
        )
        for lane in LANES
    }
    assert {key: state.name for key, state in names.items() if state} == {
        "voice": f"{entry.title} Temps jusqu'au premier jeton p95 (Voix)",
        "interactive": f"{entry.title} Temps jusqu'au premier jeton p95 (Interactive)",
        "automation": f"{entry.title} Temps jusqu'au premier jeton p95 (Automatisation)",
        "background": f"{entry.title} Temps jusqu'au premier jeton p95 (Arrière-plan)",
    }
    served = hass.states.get(
        entity_id_for(hass, entry, "sensor", "background_requests_served")
    )
    assert served is not None
    assert served.name == f"{entry.title} Requêtes servies (Arrière-plan)"
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_sensor_metadata(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    entity_registry: er.EntityRegistry,
) -> None:
    """Names, classes and units; tuning figures start disabled, the rest enabled.

    Of the latency p95 sensors the foreground lanes' are on (what a household notices).
    """
    entry = init_integration

    voice_ttft = hass.states.get(entity_id_for(hass, entry, "sensor", "voice_ttft_p95"))
    assert voice_ttft is not None
    assert voice_ttft.attributes[ATTR_FRIENDLY_NAME] == (
        f"{entry.title} Voice time to first token p95"
    )
    assert voice_ttft.attributes[ATTR_DEVICE_CLASS] == SensorDeviceClass.DURATION
    assert voice_ttft.attributes[ATTR_UNIT_OF_MEASUREMENT] == UnitOfTime.MILLISECONDS
    assert voice_ttft.attributes[ATTR_STATE_CLASS] == SensorStateClass.MEASUREMENT

    goodput = hass.states.get(entity_id_for(hass, entry, "sensor", "goodput"))
    assert goodput is not None
    assert goodput.attributes[ATTR_UNIT_OF_MEASUREMENT] == PERCENTAGE

    rejected = hass.states.get(
        entity_id_for(hass, entry, "sensor", "rejected_requests")
    )
    assert rejected is not None
    assert rejected.attributes[ATTR_STATE_CLASS] == SensorStateClass.TOTAL_INCREASING

    disabled = {
        registry_entry.unique_id.removeprefix(f"{entry.entry_id}_")
        for registry_entry in er.async_entries_for_config_entry(
            entity_registry, entry.entry_id
        )
        if registry_entry.domain == "sensor" and registry_entry.disabled_by
    }
    assert "voice_ttft_p50" in disabled
    assert "background_itl_p95" in disabled
    assert "prompt_tokens_per_second" in disabled
    # The foreground lanes' TTFT and ITL p95 are on (the dashboard graphs them), the others off.
    assert {
        "automation_ttft_p95",
        "background_ttft_p95",
        "automation_itl_p95",
    } <= disabled
    assert {
        "voice_ttft_p95",
        "interactive_ttft_p95",
        "voice_itl_p95",
        "interactive_itl_p95",
        "queue_depth",
        "in_flight",
        "goodput",
        "server_url",
        *(f"{lane.key}_requests_served" for lane in LANES),
    }.isdisjoint(disabled)
    # Every activity sensor exists, per lane and overall.
    keys = {description.key for description in ACTIVITY_SENSORS}
    for key in keys:
        entity_id_for(hass, entry, "sensor", key)


@pytest.mark.usefixtures("entity_registry_enabled_by_default")
async def test_sensors_after_requests(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Latency, throughput, goodput and counters follow real requests."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler

    voice = await async_generate(entry, lane=Lane.VOICE, requester="user:abc")
    automation = [
        await async_generate(entry, lane=Lane.AUTOMATION, requester="job:a", text=t)
        for t in ("one", "two", "three")
    ]
    too_many = scheduler.settings.lanes[Lane.VOICE].max_output_tokens + 1
    with pytest.raises(Exception):  # noqa: B017, PT011 - the scheduler's typed error
        await scheduler.generate(
            chat(max_tokens=too_many), lane=Lane.VOICE, requester="user:abc"
        )
    await async_flush_snapshots(hass)

    # One voice request: its percentiles are its own figures (states in milliseconds).
    assert voice.finished.ttft_s is not None
    for figure in ("ttft_p50", "ttft_p95"):
        assert _value(hass, entry, f"voice_{figure}") == pytest.approx(
            voice.finished.ttft_s * 1000
        )
    assert _value(hass, entry, "voice_e2e_p95") == pytest.approx(
        voice.finished.e2e_s * 1000
    )
    assert _value(hass, entry, "voice_itl_p95") >= 0
    automation_ttfts = [(r.finished.ttft_s or 0) * 1000 for r in automation]
    # The p95 of three samples lies between the smallest and the largest.
    assert (
        min(automation_ttfts) - 1e-6
        <= _value(hass, entry, "automation_ttft_p95")
        <= max(automation_ttfts) + 1e-6
    )
    assert state_of(hass, entry, "sensor", "interactive_ttft_p95") == STATE_UNKNOWN

    assert state_of(hass, entry, "sensor", "queue_depth") == "0"
    assert state_of(hass, entry, "sensor", "in_flight") == "0"
    assert _value(hass, entry, "output_tokens_per_second") > 0
    assert _value(hass, entry, "prompt_tokens_per_second") > 0

    # Goodput is over the four requests that ran; the refused one counts as rejected instead.
    finished = [voice.finished, *(r.finished for r in automation)]
    met = sum(f.met_objectives for f in finished)
    assert _value(hass, entry, "goodput") == pytest.approx(round(100 * met / 4, 2))
    assert state_of(hass, entry, "sensor", "rejected_requests") == "1"
    assert state_of(hass, entry, "sensor", "preemptions") == "0"
    served = {
        lane: state_of(hass, entry, "sensor", f"{lane.key}_requests_served")
        for lane in LANES
    }
    # The refused voice request never ran: it is not served.
    assert served == {
        Lane.VOICE: "1",
        Lane.INTERACTIVE: "0",
        Lane.AUTOMATION: "3",
        Lane.BACKGROUND: "0",
    }


async def test_requests_served_survive_reload(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A lane's total of requests served is restored after a reload and grows from there."""
    entry = init_integration
    for _ in range(2):
        await async_generate(entry, lane=Lane.AUTOMATION, requester="job:a")
    await async_flush_snapshots(hass)
    assert state_of(hass, entry, "sensor", "automation_requests_served") == "2"
    state = hass.states.get(
        entity_id_for(hass, entry, "sensor", "automation_requests_served")
    )
    assert state is not None
    assert state.attributes[ATTR_STATE_CLASS] == SensorStateClass.TOTAL_INCREASING
    assert ATTR_UNIT_OF_MEASUREMENT not in state.attributes  # never "1 requests"

    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    await _assert_served_grows_from(hass, entry, Lane.AUTOMATION, 2)


async def test_requests_served_restored_after_restart(
    ha_core: HomeAssistant, mock_config_entry: MockConfigEntry
) -> None:
    """The total stored before a restart is where the new count starts."""
    hass = ha_core
    entry = mock_config_entry
    _known_before_restart(hass, entry, "voice_requests_served", "voice_served")
    mock_restore_cache_with_extra_data(
        hass, [(State("sensor.voice_served", "41"), {"native_value": 41})]
    )
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    await _assert_served_grows_from(hass, entry, Lane.VOICE, 41)
    assert await hass.config_entries.async_unload(entry.entry_id)


async def _assert_served_grows_from(
    hass: HomeAssistant, entry: MockConfigEntry, lane: Lane, restored: int
) -> None:
    """Check that the lane's requests served show ``restored``, and one more after a request."""
    key = f"{lane.key}_requests_served"
    assert state_of(hass, entry, "sensor", key) == str(restored)
    await async_generate(entry, lane=lane, requester="user:abc")
    await async_flush_snapshots(hass)
    assert state_of(hass, entry, "sensor", key) == str(restored + 1)


async def test_server_url_sensor(
    hass: HomeAssistant, sim: SimulatedServer, init_integration: MockConfigEntry
) -> None:
    """The device shows the server's URL as text and as its link, also while it is down."""
    entry = init_integration
    device = dr.async_get(hass).async_get_device_by_identifier(
        (DOMAIN, entry.entry_id), entry.entry_id
    )
    assert device is not None
    assert device.configuration_url == sim.url
    assert state_of(hass, entry, "sensor", "server_url") == sim.url
    registry_entry = er.async_get(hass).async_get(
        entity_id_for(hass, entry, "sensor", "server_url")
    )
    assert registry_entry is not None
    assert registry_entry.entity_category == "diagnostic"

    await sim.stop()
    await entry.runtime_data.server.async_refresh()
    await hass.async_block_till_done()
    assert state_of(hass, entry, "sensor", "queue_depth") == STATE_UNAVAILABLE
    assert state_of(hass, entry, "sensor", "server_url") == sim.url


async def test_server_url_hides_credentials(
    ha_core: HomeAssistant, sim: SimulatedServer
) -> None:
    """A user and password in the URL show neither on the device nor in the sensor."""
    hass = ha_core
    url = f"http://ha:secret@127.0.0.1:{sim.port}"
    entry = await async_set_up(hass, server_entry(url, "llama_cpp"))
    device = dr.async_get(hass).async_get_device_by_identifier(
        (DOMAIN, entry.entry_id), entry.entry_id
    )
    assert device is not None
    assert device.configuration_url == sim.url
    assert state_of(hass, entry, "sensor", "server_url") == sim.url
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_kv_cache_sensor_while_a_request_runs(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """The server's KV-cache use shows at the next server poll while a sequence holds it."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    assert _value(hass, entry, "kv_cache_usage") == 0

    stream = scheduler.stream(
        chat("Summarise the week. " * 200, max_tokens=2000),
        lane=Lane.INTERACTIVE,
        requester="user:abc",
    )
    async for chunk in stream:
        if chunk.output_tokens:
            break
    await async_flush_snapshots(hass, seconds=31)

    assert _value(hass, entry, "kv_cache_usage") > 0
    assert state_of(hass, entry, "sensor", "in_flight") == "1"
    await stream.aclose()


async def test_preemptions_sensor(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Voice takes the only slot from a background stream: the preemption is counted."""
    entry = init_integration
    scheduler = entry.runtime_data.scheduler
    await async_set_options(hass, entry, **{OPT_MAX_SEQUENCES: 1, OPT_HEADROOM: 0})
    assert scheduler.settings.max_sequences == 1

    background = hass.async_create_task(
        async_generate(
            entry, lane=Lane.BACKGROUND, requester="job:nightly", max_tokens=400
        )
    )
    await async_wait_for(lambda: scheduler.snapshot().in_flight == 1)
    voice = await async_generate(entry, lane=Lane.VOICE, requester="user:abc")
    resumed = await background
    await async_flush_snapshots(hass)

    assert voice.finished.outcome == "ok"
    assert resumed.finished.outcome == "ok"
    assert resumed.finished.preemptions == 1
    assert state_of(hass, entry, "sensor", "preemptions") == "1"


async def test_requester_sensors(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """One token sensor per requester, named as the household knows it, created on first use."""
    entry = init_integration
    user = await hass.auth.async_create_user("Alice")
    satellite = dr.async_get(hass).async_get_or_create(
        config_entry_id=entry.entry_id,
        identifiers={(DOMAIN, "kitchen-satellite")},
        name="Kitchen satellite",
    )
    hass.states.async_set(
        "automation.morning", "on", {ATTR_FRIENDLY_NAME: "Morning briefing"}
    )
    evening = er.async_get(hass).async_get_or_create(
        "automation", "automation", "evening", original_name="Evening lights"
    )
    requesters = {
        f"automation:{evening.entity_id}": "Evening lights",
        f"user:{user.id}": "Alice",
        f"device:{satellite.id}": "Kitchen satellite",
        "automation:automation.morning": "Morning briefing",
        "job:nightly_summary": "nightly_summary",
        "ai_task": "AI Task",
        "benchmark run": "benchmark run",
    }
    assert not [
        e
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
        if "requester_tokens" in e.unique_id
    ]

    used: dict[str, int] = {}
    for requester in requesters:
        for text in ("first", "second"):
            result = await async_generate(entry, requester=requester, text=text)
            used[requester] = (
                used.get(requester, 0)
                + result.usage.prompt_tokens
                + result.usage.output_tokens
            )
    await async_flush_snapshots(hass)

    for requester, name in requesters.items():
        state = hass.states.get(
            entity_id_for(hass, entry, "sensor", f"requester_tokens_{requester}")
        )
        assert state is not None
        assert state.attributes[ATTR_FRIENDLY_NAME] == f"{entry.title} {name} tokens"
        assert state.attributes[ATTR_STATE_CLASS] == SensorStateClass.TOTAL_INCREASING
        assert state.attributes[ATTR_UNIT_OF_MEASUREMENT] == "tokens"
        assert int(state.state) == used[requester] > 0


async def test_requester_sensors_stop_at_their_cap(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Past ``MAX_REQUESTER_SENSORS`` a requester gets no sensor, and one warning."""
    entry = init_integration
    monkeypatch.setattr(sensor_module, "MAX_REQUESTER_SENSORS", 2)
    for requester in ("job:a", "job:b", "job:c", "job:d"):
        await async_generate(entry, requester=requester)
        await async_flush_snapshots(hass)
    sensors = sorted(
        registry_entry.unique_id.rsplit("_", 1)[-1]
        for registry_entry in er.async_entries_for_config_entry(
            er.async_get(hass), entry.entry_id
        )
        if "requester_tokens" in registry_entry.unique_id
    )
    assert sensors == ["job:a", "job:b"]
    assert caplog.text.count("the most it makes") == 2  # job:c, then job:d


async def test_requester_sensors_survive_reload(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """After a reload the count is restored, and keeps growing from there."""
    entry = init_integration
    first = await async_generate(entry, requester="job:nightly")
    await async_flush_snapshots(hass)
    before = first.usage.prompt_tokens + first.usage.output_tokens
    assert state_of(hass, entry, "sensor", "requester_tokens_job:nightly") == str(
        before
    )

    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    assert state_of(hass, entry, "sensor", "requester_tokens_job:nightly") == str(
        before
    )

    second = await async_generate(entry, requester="job:nightly")
    await async_flush_snapshots(hass)
    after = before + second.usage.prompt_tokens + second.usage.output_tokens
    assert state_of(hass, entry, "sensor", "requester_tokens_job:nightly") == str(after)


@pytest.mark.parametrize(
    ("last_state", "extra_data", "restored"),
    [
        ("1000", {"native_value": 1000, "native_unit_of_measurement": "tokens"}, 1000),
        # Without the sensor's own stored data, the last state is read instead.
        ("250", None, 250),
        ("unavailable", None, 0),
    ],
)
async def test_requester_sensor_restored_after_restart(
    ha_core: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    last_state: str,
    extra_data: dict[str, Any] | None,
    restored: int,
) -> None:
    """A requester known before a restart has its sensor back, with its count, before any request."""
    hass = ha_core
    entry = mock_config_entry
    _known_before_restart(hass, entry, "requester_tokens_job:nightly", "nightly_tokens")
    if extra_data is None:
        mock_restore_cache(hass, [State("sensor.nightly_tokens", last_state)])
    else:
        mock_restore_cache_with_extra_data(
            hass, [(State("sensor.nightly_tokens", last_state), extra_data)]
        )
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()

    assert entity_id_for(hass, entry, "sensor", "requester_tokens_job:nightly") == (
        "sensor.nightly_tokens"
    )
    assert state_of(hass, entry, "sensor", "requester_tokens_job:nightly") == str(
        restored
    )

    result = await async_generate(entry, requester="job:nightly")
    await async_flush_snapshots(hass)
    assert state_of(hass, entry, "sensor", "requester_tokens_job:nightly") == str(
        restored + result.usage.prompt_tokens + result.usage.output_tokens
    )


async def test_sensors_unavailable_when_server_down(
    hass: HomeAssistant, sim: SimulatedServer, init_integration: MockConfigEntry
) -> None:
    """When the server stops answering, the sensors go unavailable."""
    entry = init_integration
    await sim.stop()

    await entry.runtime_data.server.async_refresh()
    await hass.async_block_till_done()

    for key in ("queue_depth", "voice_ttft_p95", "loaded_model", "kv_cache_usage"):
        assert state_of(hass, entry, "sensor", key) == STATE_UNAVAILABLE


@pytest.mark.usefixtures("socket_enabled")
async def test_no_kv_cache_sensor_when_server_does_not_report_it(
    ha_core: HomeAssistant,
) -> None:
    """Ollama reports no KV-cache use: no such sensor."""
    hass = ha_core
    async with SimulatedServer(SimConfig(kind="ollama", speed=50)) as sim:
        entry = await async_set_up(
            hass, server_entry(sim.url, "ollama", title="Ollama (sim)")
        )
        assert (
            er.async_get(hass).async_get_entity_id(
                "sensor", DOMAIN, f"{entry.entry_id}_kv_cache_usage"
            )
            is None
        )
        assert state_of(hass, entry, "sensor", "loaded_model") == MODEL
        assert await hass.config_entries.async_unload(entry.entry_id)
