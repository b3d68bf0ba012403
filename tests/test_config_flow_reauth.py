"""Reauthentication: a server that refuses the stored key asks for a new one, at set-up or on a poll."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web
from homeassistant import config_entries
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_API_KEY
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tools.simulator.server import SimConfig, SimulatedServer

from .support.entries import server_entry
from .support.llamacpp import free_port


class KeyedSimulatedServer(SimulatedServer):
    """The simulated llama.cpp behind an API key: 401 unless ``Authorization: Bearer <key>``."""

    def __init__(self, config: SimConfig, api_key: str) -> None:
        """Serve ``config``; ``api_key`` may change while it runs (the key was rotated)."""
        super().__init__(config)
        self.api_key = api_key

    def _add_routes(self, app: web.Application) -> None:
        super()._add_routes(app)

        @web.middleware
        async def check_key(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response({"error": "invalid api key"}, status=401)
            return await handler(request)

        app.middlewares.append(check_key)


@asynccontextmanager
async def _keyed_server_and_entry(
    hass: HomeAssistant, server_key: str, entry_key: str
) -> AsyncIterator[tuple[KeyedSimulatedServer, MockConfigEntry]]:
    """Run a keyed server on a fixed port (so it can stop and start again) and add its entry."""
    port = free_port()
    server = KeyedSimulatedServer(SimConfig(slots=2, speed=50.0, port=port), server_key)
    async with server:
        entry = server_entry(
            server.url,
            "llama_cpp",
            api_key=entry_key,
            title="llama.cpp (keyed sim)",
            unique_id=f"llama_cpp@127.0.0.1:{port}",
        )
        entry.add_to_hass(hass)
        yield server, entry


def _reauth_flow_ids(hass: HomeAssistant, entry: MockConfigEntry) -> list[str]:
    return [
        str(flow["flow_id"])
        for flow in entry.async_get_active_flows(hass, {config_entries.SOURCE_REAUTH})
    ]


@pytest.mark.usefixtures("ha_core", "socket_enabled")
async def test_reauth_when_set_up_is_refused(hass: HomeAssistant) -> None:
    """A refused key at set-up asks for a new one: wrong key, server down, then the right one."""
    async with _keyed_server_and_entry(hass, "new", "old") as (server, entry):
        assert not await hass.config_entries.async_setup(entry.entry_id)
        await hass.async_block_till_done()
        assert entry.state is ConfigEntryState.SETUP_ERROR
        (flow_id,) = _reauth_flow_ids(hass, entry)
        result = await hass.config_entries.flow.async_configure(flow_id)
        assert result["type"] is FlowResultType.FORM
        assert result["step_id"] == "reauth_confirm"

        result = await hass.config_entries.flow.async_configure(
            flow_id, {CONF_API_KEY: "wrong"}
        )
        assert result["type"] is FlowResultType.FORM
        assert result["errors"] == {"base": "invalid_auth"}

        await server.stop()
        result = await hass.config_entries.flow.async_configure(
            flow_id, {CONF_API_KEY: "new"}
        )
        assert result["type"] is FlowResultType.FORM
        assert result["errors"] == {"base": "cannot_connect"}

        await server.start()
        result = await hass.config_entries.flow.async_configure(
            flow_id, {CONF_API_KEY: " new "}
        )
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "reauth_successful"
        await hass.async_block_till_done()
        assert entry.data[CONF_API_KEY] == "new"
        assert entry.state is ConfigEntryState.LOADED
        assert await hass.config_entries.async_unload(entry.entry_id)


@pytest.mark.usefixtures("ha_core", "socket_enabled")
async def test_reauth_when_a_poll_is_refused(hass: HomeAssistant) -> None:
    """The key is rotated on the server while the entry runs: the next poll starts reauth."""
    async with _keyed_server_and_entry(hass, "first", "first") as (server, entry):
        assert await hass.config_entries.async_setup(entry.entry_id)
        await hass.async_block_till_done()
        assert _reauth_flow_ids(hass, entry) == []

        server.api_key = "second"
        coordinator = entry.runtime_data.server
        await coordinator.async_refresh()
        await hass.async_block_till_done()
        assert not coordinator.last_update_success
        # Refused is not unreachable: no "server unreachable" repair starts counting.
        assert coordinator.unreachable_since is None
        (flow_id,) = _reauth_flow_ids(hass, entry)

        result = await hass.config_entries.flow.async_configure(
            flow_id, {CONF_API_KEY: "second"}
        )
        assert result["reason"] == "reauth_successful"
        await hass.async_block_till_done()
        assert entry.data[CONF_API_KEY] == "second"
        assert entry.state is ConfigEntryState.LOADED
        assert entry.runtime_data.server.last_update_success
        assert await hass.config_entries.async_unload(entry.entry_id)


@pytest.mark.usefixtures("ha_core")
async def test_reauth_without_key_when_server_no_longer_asks(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry
) -> None:
    """An empty key that the server accepts removes the stored key."""
    mock_config_entry.add_to_hass(hass)
    hass.config_entries.async_update_entry(
        mock_config_entry, data={**mock_config_entry.data, CONF_API_KEY: "stale"}
    )
    result = await mock_config_entry.start_reauth_flow(hass)
    assert result["step_id"] == "reauth_confirm"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_API_KEY: " "}
    )
    assert result["reason"] == "reauth_successful"
    assert CONF_API_KEY not in mock_config_entry.data
