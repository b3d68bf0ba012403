"""The server-reachable binary sensor."""

from __future__ import annotations

from dataclasses import replace

from homeassistant.components.binary_sensor import BinarySensorDeviceClass
from homeassistant.const import ATTR_DEVICE_CLASS, STATE_OFF, STATE_ON
from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tools.simulator.server import SimulatedServer

from .support.entities import entity_id_for, state_of


async def test_server_reachable(
    hass: HomeAssistant, sim: SimulatedServer, init_integration: MockConfigEntry
) -> None:
    """On while the server answers, off (and still available) when it stops, on again after."""
    entry = init_integration
    server = entry.runtime_data.server

    state = hass.states.get(
        entity_id_for(hass, entry, "binary_sensor", "server_reachable")
    )
    assert state is not None
    assert state.state == STATE_ON
    assert state.attributes[ATTR_DEVICE_CLASS] == BinarySensorDeviceClass.CONNECTIVITY

    port = sim.port
    await sim.stop()
    await server.async_refresh()
    await hass.async_block_till_done()
    assert state_of(hass, entry, "binary_sensor", "server_reachable") == STATE_OFF

    async with SimulatedServer(replace(sim.config, port=port)):
        await server.async_refresh()
        await hass.async_block_till_done()
        assert state_of(hass, entry, "binary_sensor", "server_reachable") == STATE_ON
        assert await hass.config_entries.async_unload(entry.entry_id)
