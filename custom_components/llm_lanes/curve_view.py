"""The batch-curve chart of ``llm_lanes.run_benchmark``, served by Home Assistant itself.

``GET /api/llm_lanes/curve/<entry id>.svg`` answers the chart of the entry's last calibration
(``Calibration.record.plot``) to a logged-in user, or to the signed URL the action returns
(``curve_plot_url``, valid for a day), whatever the configuration folder holds: nothing is written
under ``www/``, which Home Assistant serves as ``/local`` only if it existed at start.
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from homeassistant.config_entries import ConfigEntryState
from homeassistant.helpers.http import KEY_HASS, HomeAssistantView

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry


class CurvePlotView(HomeAssistantView):
    """Serve the SVG chart of an entry's last calibration (404 when it has none)."""

    url = f"/api/{DOMAIN}/curve/{{entry_id}}.svg"
    name = f"api:{DOMAIN}:curve"
    requires_auth = True

    async def get(self, request: web.Request, entry_id: str) -> web.Response:
        """Answer the chart, never cached (a new calibration replaces it)."""
        hass = request.app[KEY_HASS]
        entry: LLMLanesConfigEntry | None = hass.config_entries.async_get_entry(
            entry_id
        )
        if (
            entry is None
            or entry.domain != DOMAIN
            or entry.state is not ConfigEntryState.LOADED
            or (record := entry.runtime_data.calibration.record) is None
            or record.plot is None
        ):
            return web.Response(status=HTTPStatus.NOT_FOUND)
        return web.Response(
            text=record.plot,
            content_type="image/svg+xml",
            headers={"Cache-Control": "no-store"},
        )
