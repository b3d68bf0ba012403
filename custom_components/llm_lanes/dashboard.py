"""The LLM Lanes dashboard: one view per server, offered in *Add dashboard* as a strategy.

The frontend lists custom dashboard strategies in its *Add dashboard* dialog. The integration ships
a small one (``frontend/dashboard-strategy.js``, type ``custom:llm-lanes``) that asks this module
for the dashboard over the websocket (``llm_lanes/dashboard``), so the view always shows the
entities the servers have now (their ids as the user renamed them, new requesters). *Take control*
in the dashboard's menu turns it into cards the user can edit.

With several servers a first view shows them side by side (``servers_view``: the household's
pool). Each server's view shows, per lane, time to first token and inter-token latency over the last day, queue
depth and sequences in flight, goodput, the requests each lane served, tokens per requester per
day and tonight's jobs. The latency graphs show the lanes that have served requests (all lanes
until one has, or when none of those has its figure enabled). Figures that start disabled (the
background lanes' TTFT and ITL p95, the per-lane queues) are left out until enabled; an admin's
view has a note that names them and says where to enable them (a user who is not an admin
cannot open that page, and gets no such note).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from homeassistant.components import frontend, websocket_api
from homeassistant.components.http.server import StaticPathConfig
from homeassistant.components.websocket_api.connection import ActiveConnection
from homeassistant.components.websocket_api.decorators import websocket_command
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import entity_registry as er
import probatio

from custom_components.llm_lanes.const import DOMAIN, OPT_BACKGROUND_PAUSED
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.requesters import requester_sensor_prefix

WS_TYPE: Final = "llm_lanes/dashboard"
STRATEGY_URL: Final = "/llm_lanes/dashboard-strategy.js"
STRATEGY_FILE: Final = Path(__file__).parent / "frontend" / "dashboard-strategy.js"
HOURS_SHOWN: Final = 24
DAYS_SHOWN: Final = 7


async def async_setup_dashboard(hass: HomeAssistant) -> None:
    """Answer the strategy's websocket command; serve and load the strategy in the frontend."""
    websocket_api.async_register_command(hass, websocket_dashboard)
    if "frontend" not in hass.config.components:
        return
    await hass.http.async_register_static_paths(
        [StaticPathConfig(STRATEGY_URL, str(STRATEGY_FILE), cache_headers=False)]
    )
    frontend.add_extra_js_url(hass, STRATEGY_URL)


@websocket_command(
    {
        probatio.Required("type"): WS_TYPE,
        probatio.Optional("config_entry_id"): str,
    }
)
@callback
def websocket_dashboard(
    hass: HomeAssistant,
    connection: ActiveConnection,
    msg: dict[str, Any],
) -> None:
    """Send the dashboard of every loaded server, or of the one asked for, to the asking user."""
    entries: list[LLMLanesConfigEntry] = [
        entry
        for entry in hass.config_entries.async_loaded_entries(DOMAIN)
        if msg.get("config_entry_id") in (None, entry.entry_id)
    ]
    connection.send_result(
        msg["id"], dashboard_config(hass, entries, admin=connection.user.is_admin)
    )


def dashboard_config(
    hass: HomeAssistant, entries: list[LLMLanesConfigEntry], *, admin: bool = True
) -> dict[str, Any]:
    """Build the dashboard: one view per server (a view that says how to add one without any)."""
    if not entries:
        return {
            "title": "LLM Lanes",
            "views": [
                {
                    "title": "LLM Lanes",
                    "cards": [
                        {
                            "type": "markdown",
                            "content": "No LLM Lanes server is loaded. Add one in "
                            "*Settings → Devices & services*.",
                        }
                    ],
                }
            ],
        }
    views = [
        server_view(hass, entry, index, admin=admin)
        for index, entry in enumerate(entries)
    ]
    if len(entries) > 1:
        views.insert(0, servers_view(hass, entries))
    return {"title": "LLM Lanes", "views": views}


type Row = dict[str, str]
"""One entity of a card: ``{"entity": <entity id>, "name": <its name, without the device's>}``."""


class _Entities:
    """One server's entities, found by the key their unique id ends with, as rows of cards."""

    def __init__(self, hass: HomeAssistant, entry: LLMLanesConfigEntry) -> None:
        self._hass = hass
        self._registry = er.async_get(hass)
        self._entry = entry
        self.disabled: list[str] = []
        """Names of the wanted entities the user has not enabled."""

    def _row(self, registry_entry: er.RegistryEntry) -> Row:
        name = registry_entry.name or registry_entry.original_name
        return {"entity": registry_entry.entity_id, "name": name or ""}

    def get(self, platform: Platform, key: str) -> Row | None:
        """Return the enabled entity with this key (a disabled one is noted, then left out)."""
        entity_id = self._registry.async_get_entity_id(
            platform, DOMAIN, f"{self._entry.entry_id}_{key}"
        )
        registry_entry = self._registry.async_get(entity_id) if entity_id else None
        if registry_entry is None:
            return None
        if registry_entry.disabled_by is not None:
            self.disabled.append(
                self._row(registry_entry)["name"] or registry_entry.entity_id
            )
            return None
        return self._row(registry_entry)

    def sensors(self, keys: list[str]) -> list[Row]:
        """Return the enabled sensors of these keys, in order."""
        return [row for key in keys if (row := self.get(Platform.SENSOR, key))]

    def lane_sensors(self, figure: str) -> list[Row]:
        """Return one figure's enabled sensors of the lanes with data, in lane order.

        A lane has data once it has served a request (its *requests served*, kept across
        restarts). Until one has, or when none of those has the figure enabled, the figure's
        enabled sensors of every lane are returned: a graph that fills as requests come.
        """
        rows = {
            lane: row
            for lane in LANES
            if (row := self.get(Platform.SENSOR, f"{lane.key}_{figure}"))
        }
        with_data = [row for lane, row in rows.items() if self._served_requests(lane)]
        return with_data or list(rows.values())

    def _entity_id(self, key: str) -> str | None:
        return self._registry.async_get_entity_id(
            Platform.SENSOR, DOMAIN, f"{self._entry.entry_id}_{key}"
        )

    def _served_requests(self, lane: Lane) -> bool:
        """Whether the lane has served a request (its *requests served* is above 0)."""
        entity_id = self._entity_id(f"{lane.key}_requests_served")
        state = self._hass.states.get(entity_id) if entity_id else None
        try:
            return state is not None and float(state.state) > 0
        except ValueError:  # unknown, unavailable
            return False

    def requester_sensors(self) -> list[Row]:
        """Return the enabled token sensors of the requesters, by name."""
        prefix = requester_sensor_prefix(self._entry.entry_id)
        rows = [
            self._row(registry_entry)
            for registry_entry in er.async_entries_for_config_entry(
                self._registry, self._entry.entry_id
            )
            if registry_entry.domain == Platform.SENSOR
            and registry_entry.unique_id.startswith(prefix)
            and registry_entry.disabled_by is None
        ]
        return sorted(rows, key=lambda row: row["name"].casefold())


def _section(heading: str, *cards: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "grid",
        "cards": [
            {"type": "heading", "heading": heading},
            *(card for card in cards if card is not None),
        ],
    }


def _graph(rows: list[Row], **card: Any) -> dict[str, Any] | None:
    """Return a graph card of these rows (None without any: an empty graph shows an error)."""
    if not rows:
        return None
    return {**card, "entities": rows}


def _history(title: str, rows: list[Row]) -> dict[str, Any] | None:
    return _graph(rows, type="history-graph", title=title, hours_to_show=HOURS_SHOWN)


def _daily_bars(title: str, rows: list[Row]) -> dict[str, Any] | None:
    """Show how much a total grew per day (long-term statistics: the first bar after an hour)."""
    return _graph(
        rows,
        type="statistics-graph",
        title=title,
        chart_type="bar",
        stat_types=["change"],
        period="day",
        days_to_show=DAYS_SHOWN,
    )


def _list(title: str | None, rows: list[Row | None]) -> dict[str, Any] | None:
    shown = [row for row in rows if row is not None]
    if not shown:
        return None
    card: dict[str, Any] = {"type": "entities", "entities": shown}
    if title is not None:
        card["title"] = title
    return card


def _tiles(rows: list[Row | None]) -> list[dict[str, Any]]:
    return [{"type": "tile", **row} for row in rows if row is not None]


def server_view(
    hass: HomeAssistant,
    entry: LLMLanesConfigEntry,
    index: int = 0,
    *,
    admin: bool = True,
) -> dict[str, Any]:
    """Build the view of one server (a *sections* view), for an admin or another user.

    Its tab shows its title (a view with an icon shows the icon alone: every server's the same).
    """
    entities = _Entities(hass, entry)
    latency = _latency_section(entities)
    sections = [
        _now_section(entities),
        latency,
        _load_section(entities),
        _tokens_section(entities),
        _jobs_section(entities),
    ]
    # Once every section has looked its entities up: the disabled ones are all known. Only an
    # admin may enable them (Settings → Entities).
    if entities.disabled and admin:
        latency["cards"].append(_disabled_note(entities.disabled))
    return {
        "type": "sections",
        "title": entry.title,
        "path": f"server-{index + 1}",
        "max_columns": 3,
        "sections": sections,
    }


def _now_section(entities: _Entities) -> dict[str, Any]:
    """Tiles of what the server does now: goodput, load, reachability, background paused."""
    return _section(
        "Now",
        *_tiles(
            [
                entities.get(Platform.SENSOR, "goodput"),
                entities.get(Platform.SENSOR, "queue_depth"),
                entities.get(Platform.SENSOR, "in_flight"),
                entities.get(Platform.SENSOR, "output_tokens_per_second"),
                entities.get(Platform.BINARY_SENSOR, "server_reachable"),
                entities.get(Platform.SWITCH, OPT_BACKGROUND_PAUSED),
            ]
        ),
    )


def _latency_section(entities: _Entities) -> dict[str, Any]:
    """Graph the lanes' time to first token and inter-token latency (p95) over the last day."""
    return _section(
        "Latency per lane",
        _history("Time to first token p95", entities.lane_sensors("ttft_p95")),
        _history("Inter-token latency p95", entities.lane_sensors("itl_p95")),
    )


def _load_section(entities: _Entities) -> dict[str, Any]:
    """Queues and sequences in flight over the day, goodput, the requests each lane served."""
    served = entities.sensors([f"{lane.key}_requests_served" for lane in LANES])
    return _section(
        "Load",
        _history(
            "Queue and sequences in flight",
            entities.sensors(
                [
                    "queue_depth",
                    "in_flight",
                    *(f"{lane.key}_queue_depth" for lane in LANES),
                ]
            ),
        ),
        _history("Goodput", entities.sensors(["goodput"])),
        _daily_bars("Requests served per day", served),
        _list("Total requests served", list(served)),
    )


def _tokens_section(entities: _Entities) -> dict[str, Any]:
    """Every requester's tokens, per day and in all."""
    requesters = entities.requester_sensors()
    return _section(
        "Tokens per requester",
        _daily_bars("Tokens per day", requesters),
        _list("Total tokens", list(requesters)),
    )


def _jobs_section(entities: _Entities) -> dict[str, Any]:
    """Tonight's jobs: waiting and done, their tokens and budget, and the pause switch."""
    return _section(
        "Tonight's jobs",
        _list(
            None,
            [
                *entities.sensors(
                    [
                        "jobs_waiting",
                        "jobs_done_tonight",
                        "job_tokens_tonight",
                        "job_budget_used",
                    ]
                ),
                entities.get(Platform.SWITCH, "jobs_paused"),
            ],
        ),
    )


def _disabled_note(disabled: list[str]) -> dict[str, Any]:
    """Name the figures left out until the user enables them, and say where."""
    return {
        "type": "markdown",
        "content": "Not shown until enabled: "
        + ", ".join(sorted(disabled))
        + ". Enable them in *Settings → Devices & services → Entities* "
        "(select them, then *Enable selected*).",
    }


# --- several servers: the household's pool ------------------------------------------------------


def servers_view(
    hass: HomeAssistant, entries: list[LLMLanesConfigEntry]
) -> dict[str, Any]:
    """Build the view of the household's servers side by side, and where each lane goes now.

    One section per server: its state in the pool, whether it answers, its goodput, load and
    voice's time to first token, and the pool's requests it served and lost to a failover.
    """
    sections = []
    for entry in entries:
        entities = _Entities(hass, entry)
        section = _section(
            entry.title,
            *_tiles(
                [
                    entities.get(Platform.SENSOR, "pool_state"),
                    entities.get(Platform.BINARY_SENSOR, "server_reachable"),
                    entities.get(Platform.SENSOR, "goodput"),
                    entities.get(Platform.SENSOR, "in_flight"),
                    entities.get(Platform.SENSOR, "voice_ttft_p95"),
                    entities.get(Platform.SENSOR, "pool_requests_served"),
                    entities.get(Platform.SENSOR, "pool_failovers"),
                ]
            ),
        )
        sections.append(section)
    first = _Entities(hass, entries[0])
    # One row per server, named by the server (each one's own name is "State in the pool").
    states = [
        {**row, "name": entry.title}
        for entry in entries
        if (row := _Entities(hass, entry).get(Platform.SENSOR, "pool_state"))
    ]
    sections.append(
        _section(
            "Where each lane goes",
            _list(
                None,
                [
                    first.get(Platform.SENSOR, f"{lane.key}_pool_server")
                    for lane in LANES
                ],
            ),
            _history("Servers in the pool", states),
        )
    )
    return {
        "type": "sections",
        "title": "Servers",
        "path": "servers",
        "max_columns": min(len(entries), 4),
        "sections": sections,
    }
