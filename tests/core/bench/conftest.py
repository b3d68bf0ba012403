"""Fixtures of the benchmark tests: loopback sockets and simulated servers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tools.simulator.server import SimConfig, SimulatedServer


@pytest.fixture(autouse=True)
def loopback_sockets(socket_enabled: None) -> None:
    """Allow loopback sockets: the simulator is a real server (HA's harness blocks sockets)."""


@pytest.fixture
async def start_sim() -> AsyncIterator[
    Callable[[SimConfig], Awaitable[SimulatedServer]]
]:
    """Start simulated servers; all are stopped when the test ends."""
    servers: list[SimulatedServer] = []

    async def start(config: SimConfig) -> SimulatedServer:
        server = SimulatedServer(config)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()
