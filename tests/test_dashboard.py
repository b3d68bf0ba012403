"""The dashboard the strategy asks for over the websocket: one view per server, its entities."""

from __future__ import annotations

from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import WebSocketGenerator

from custom_components.llm_lanes.core.lanes import LANES, Lane

from .support.entities import async_flush_snapshots, entity_id_for
from .support.requests import async_generate


async def _dashboard(
    hass_ws_client: WebSocketGenerator, **message: Any
) -> dict[str, Any]:
    client = await hass_ws_client()
    await client.send_json_auto_id({"type": "llm_lanes/dashboard", **message})
    response = await client.receive_json()
    assert response["success"], response
    result: dict[str, Any] = response["result"]
    return result


def _cards(view: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Return each section's cards by the section's heading."""
    return {
        section["cards"][0]["heading"]: section["cards"][1:]
        for section in view["sections"]
    }


def _sensor(hass: HomeAssistant, entry: MockConfigEntry, key: str) -> str:
    return entity_id_for(hass, entry, "sensor", key)


def _ids(card: dict[str, Any]) -> list[str]:
    """Return the entity ids a card shows (each row also carries the entity's own name)."""
    return [row["entity"] for row in card["entities"]]


async def test_view_shows_what_a_new_server_has(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_ws_client: WebSocketGenerator,
) -> None:
    """Latency per lane, load, goodput, requests, tokens per requester, tonight's jobs."""
    entry = init_integration
    await async_generate(entry, requester="job:digest")
    await async_flush_snapshots(hass)

    dashboard = await _dashboard(hass_ws_client)
    (view,) = dashboard["views"]
    assert view["title"] == entry.title
    assert view["type"] == "sections"
    cards = _cards(view)
    assert list(cards) == [
        "Now",
        "Latency per lane",
        "Load",
        "Tokens per requester",
        "Tonight's jobs",
    ]
    assert cards["Now"][0]["name"] == "Goodput"
    assert [card["entity"] for card in cards["Now"]] == [
        _sensor(hass, entry, "goodput"),
        _sensor(hass, entry, "queue_depth"),
        _sensor(hass, entry, "in_flight"),
        _sensor(hass, entry, "output_tokens_per_second"),
        entity_id_for(hass, entry, "binary_sensor", "server_reachable"),
        entity_id_for(hass, entry, "switch", "background_paused"),
    ]
    # The foreground lanes' TTFT and ITL p95 start enabled. The request ran in the automation
    # lane, whose figures are disabled: the graphs show what is enabled, filling as requests
    # come, and the note names the figures left out.
    ttft, itl, note = cards["Latency per lane"]
    assert ttft["type"] == itl["type"] == "history-graph"
    assert ttft["entities"] == [
        {
            "entity": _sensor(hass, entry, "voice_ttft_p95"),
            "name": "Voice time to first token p95",
        },
        {
            "entity": _sensor(hass, entry, "interactive_ttft_p95"),
            "name": "Interactive time to first token p95",
        },
    ]
    assert _ids(itl) == [
        _sensor(hass, entry, "voice_itl_p95"),
        _sensor(hass, entry, "interactive_itl_p95"),
    ]
    assert note["type"] == "markdown"
    assert "Automation time to first token p95" in note["content"]
    assert "Background inter-token latency p95" in note["content"]
    assert "Settings" in note["content"]

    history, goodput, served_per_day, served = cards["Load"]
    assert _ids(history) == [
        _sensor(hass, entry, "queue_depth"),
        _sensor(hass, entry, "in_flight"),
    ]
    assert _ids(goodput) == [_sensor(hass, entry, "goodput")]
    assert served_per_day["type"] == "statistics-graph"
    assert served_per_day["stat_types"] == ["change"]
    assert (
        _ids(served_per_day)
        == _ids(served)
        == [_sensor(hass, entry, f"{lane.key}_requests_served") for lane in LANES]
    )
    tokens_per_day, tokens = cards["Tokens per requester"]
    assert (
        _ids(tokens_per_day)
        == _ids(tokens)
        == [_sensor(hass, entry, "requester_tokens_job:digest")]
    )
    (jobs,) = cards["Tonight's jobs"]
    assert _ids(jobs) == [
        _sensor(hass, entry, "jobs_waiting"),
        _sensor(hass, entry, "jobs_done_tonight"),
        _sensor(hass, entry, "job_tokens_tonight"),
        _sensor(hass, entry, "job_budget_used"),
        entity_id_for(hass, entry, "switch", "jobs_paused"),
    ]


async def test_view_follows_enabled_and_renamed_entities(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_ws_client: WebSocketGenerator,
    entity_registry: er.EntityRegistry,
) -> None:
    """Enabled figures join their graph (the note goes); a renamed entity id is used."""
    entry = init_integration
    for lane in LANES:
        for figure in ("ttft_p95", "itl_p95", "queue_depth"):
            entity_registry.async_update_entity(
                _sensor(hass, entry, f"{lane.key}_{figure}"), disabled_by=None
            )
    entity_registry.async_update_entity(
        _sensor(hass, entry, "voice_ttft_p95"), new_entity_id="sensor.voice_wait"
    )

    (view,) = (await _dashboard(hass_ws_client))["views"]
    ttft, itl = _cards(view)["Latency per lane"]
    assert _ids(ttft) == [
        "sensor.voice_wait",
        *(_sensor(hass, entry, f"{lane.key}_ttft_p95") for lane in list(LANES)[1:]),
    ]
    assert _ids(itl) == [_sensor(hass, entry, f"{lane.key}_itl_p95") for lane in LANES]
    assert len(_ids(_cards(view)["Load"][0])) == 6


async def test_latency_graphs_show_the_lanes_with_data(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_ws_client: WebSocketGenerator,
) -> None:
    """After typed chats (interactive), voice's empty figures leave the latency graphs."""
    entry = init_integration
    await async_generate(entry, lane=Lane.INTERACTIVE, requester="user:someone")
    await async_flush_snapshots(hass)

    (view,) = (await _dashboard(hass_ws_client))["views"]
    ttft, itl, _note = _cards(view)["Latency per lane"]
    assert _ids(ttft) == [_sensor(hass, entry, "interactive_ttft_p95")]
    assert _ids(itl) == [_sensor(hass, entry, "interactive_itl_p95")]
    state = hass.states.get(_sensor(hass, entry, "interactive_ttft_p95"))
    assert state is not None
    assert float(state.state) > 0


async def test_only_an_admin_is_told_to_enable_figures(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_ws_client: WebSocketGenerator,
    hass_read_only_access_token: str,
) -> None:
    """The note points to Settings, which only an admin can open: a user gets the graphs alone."""
    client = await hass_ws_client(hass, hass_read_only_access_token)
    await client.send_json_auto_id({"type": "llm_lanes/dashboard"})
    response = await client.receive_json()
    assert response["success"], response
    (view,) = response["result"]["views"]
    latency = _cards(view)["Latency per lane"]
    assert [card["type"] for card in latency] == ["history-graph", "history-graph"]
    admin_view = (await _dashboard(hass_ws_client))["views"][0]
    assert _cards(admin_view)["Latency per lane"][-1]["type"] == "markdown"


async def test_one_server_or_none(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_ws_client: WebSocketGenerator,
) -> None:
    """The strategy may name one server; with none loaded the view says how to add one."""
    entry = init_integration
    dashboard = await _dashboard(hass_ws_client, config_entry_id=entry.entry_id)
    assert [view["title"] for view in dashboard["views"]] == [entry.title]

    assert await hass.config_entries.async_unload(entry.entry_id)
    (view,) = (await _dashboard(hass_ws_client))["views"]
    (card,) = view["cards"]
    assert "No LLM Lanes server is loaded" in card["content"]
