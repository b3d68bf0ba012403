"""Fixtures for the backend tests: real loopback servers.

``serve`` starts a real aiohttp server on loopback with the given routes: the tests use it to
stand in for a server that misbehaves on purpose, and to replay recorded responses while
recording what the client sent. ``llama_server`` (``tests/conftest.py``) is a real llama.cpp
server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
import json
from pathlib import Path
from typing import Any

from aiohttp import web
import pytest

FIXTURES = Path(__file__).parents[2] / "fixtures"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
type Serve = Callable[[dict[str, Handler]], Awaitable[FakeServer]]
"""What ``serve`` gives a test: start a loopback server with these routes."""
CHAT = "POST /v1/chat/completions"
"""The OpenAI-compatible chat route."""

RELEASE = web.AppKey("release", asyncio.Event)
"""Set when the test ends: handlers that stall on purpose wait for it, so none outlives the test."""


async def stall_until_released(request: web.Request) -> None:
    """Hold a request open until the test is over."""
    await request.app[RELEASE].wait()


@dataclass
class FakeServer:
    """A running loopback server and the JSON bodies it received, by path."""

    url: str
    received: dict[str, list[Any]] = field(default_factory=dict)


@pytest.fixture(autouse=True)
def loopback_sockets(socket_enabled: None) -> None:
    """Allow sockets: these tests talk to real servers on loopback (Home Assistant's harness blocks sockets)."""


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start loopback servers from ``{"METHOD /path": handler}`` maps; stopped after the test."""
    runners: list[web.AppRunner] = []
    release = asyncio.Event()

    async def start(routes: dict[str, Handler]) -> FakeServer:
        server = FakeServer(url="")

        def recording(path: str, handler: Handler) -> Handler:
            async def wrapped(request: web.Request) -> web.StreamResponse:
                body: Any = None
                if request.can_read_body:
                    raw = await request.read()
                    body = json.loads(raw) if raw else None
                server.received.setdefault(path, []).append(body)
                return await handler(request)

            return wrapped

        app = web.Application()
        app[RELEASE] = release
        for key, handler in routes.items():
            method, path = key.split(" ", 1)
            app.router.add_route(method, path, recording(path, handler))
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        server.url = f"http://127.0.0.1:{port}"
        return server

    yield start
    release.set()
    await asyncio.sleep(0)
    for runner in runners:
        await runner.cleanup()


def json_handler(data: Any, status: int = 200) -> Handler:
    """Make a handler answering a fixed JSON document."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(data, status=status)

    return handler


def text_handler(
    text: str, status: int = 200, content_type: str = "text/plain"
) -> Handler:
    """Make a handler answering a fixed body."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=text, status=status, content_type=content_type)

    return handler


def lines_handler(
    lines: list[str], content_type: str = "application/x-ndjson"
) -> Handler:
    """Make a handler streaming the given lines, one write each, then ending the body."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        for line in lines:
            await response.write(line.encode() + b"\n")
        await response.write_eof()
        return response

    return handler


def fixture_text(name: str) -> str:
    """Read a recorded response from tests/fixtures."""
    return (FIXTURES / name).read_text()
