"""No gateway client learns where the household's LLM servers are: errors name them by title.

A server that is down, that answers 500 or 501 (its own body naming its address, as some do),
or that dies mid-stream: each error a real ``openai`` or ``ollama`` client reads, streamed or
not, names the server by its entry's title and holds none of its URL, ``host:port`` or port.
The admin's log keeps the URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
import json
import logging
from typing import Any

from aiohttp import web
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
import ollama
import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.gateway.addresses import hide_addresses
from tests.support.entries import MODEL
from tools.simulator.server import SimulatedServer

from .conftest import Gateway
from .samples import HELLO
from .sim import GatewaySim

TITLE = "llama.cpp (sim)"
"""The title of the simulated server's entry (``tests.conftest.mock_config_entry``)."""
ANSWERING = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
    "/api/chat", "/api/generate", "/api/embed",
})  # fmt: skip
"""The paths that answer a client's request (the polls' paths keep answering)."""

type Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FailingSim(GatewaySim):
    """The simulated server, answering a client's request with ``fail`` (a status) when set."""

    fail: int | None = None

    def _add_routes(self, app: web.Application) -> None:
        super()._add_routes(app)
        app.middlewares.append(self._failing)

    @web.middleware
    async def _failing(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        if self.fail is None or request.path not in ANSWERING:
            return await handler(request)
        # A server that names its own address in its error, as some proxies do.
        message = f"internal failure at {self.url}{request.path}"
        if self.config.kind == "ollama":
            return web.json_response({"error": message}, status=self.fail)
        error = {"code": self.fail, "message": message, "type": "server_error"}
        return web.json_response({"error": error}, status=self.fail)


@pytest.fixture
def sim_server_class() -> type[SimulatedServer]:
    """Serve a simulated server that can fail on demand."""
    return FailingSim


def assert_no_address(text: str, sim: SimulatedServer) -> None:
    """Check that ``text`` names the server by its title and holds nothing of its address."""
    assert TITLE in text
    assert sim.url not in text
    assert str(sim.port) not in text
    assert "127.0.0.1" not in text


async def openai_errors(gateway: Gateway, key: str) -> AsyncIterator[str]:
    """Yield what an OpenAI client reads of a failing chat, streamed and not, and embeddings."""
    api = gateway.openai(key)
    with pytest.raises(openai.APIStatusError) as plain:
        await api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    yield plain.value.response.text
    with pytest.raises(openai.APIStatusError) as streamed:
        await api.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=4, stream=True
        )
    yield streamed.value.response.text
    with pytest.raises(openai.APIStatusError) as embedded:
        await api.embeddings.create(model=MODEL, input="kitchen")
    yield embedded.value.response.text


async def ollama_errors(gateway: Gateway, key: str) -> AsyncIterator[str]:
    """Yield what an Ollama client reads of a failing chat, streamed and not, and embeddings."""
    api = gateway.ollama(key)
    with pytest.raises(ollama.ResponseError) as plain:
        await api.chat(model=MODEL, messages=HELLO, options={"num_predict": 4})
    yield plain.value.error
    with pytest.raises(ollama.ResponseError) as streamed:
        async for _ in await api.chat(
            model=MODEL, messages=HELLO, options={"num_predict": 4}, stream=True
        ):
            pass
    yield streamed.value.error
    with pytest.raises(ollama.ResponseError) as embedded:
        await api.embed(model=MODEL, input="kitchen")
    yield embedded.value.error


async def every_error(gateway: Gateway, key: str) -> list[str]:
    """Return what both clients read of every failing request."""
    return [text async for text in openai_errors(gateway, key)] + [
        text async for text in ollama_errors(gateway, key)
    ]


@pytest.mark.parametrize("status", [500, 501])
async def test_a_server_error_names_the_server_not_its_address(
    gateway: Gateway,
    init_integration: MockConfigEntry,
    sim: FailingSim,
    status: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server's HTTP error reaches each client as a 502 naming the server; the log has the URL."""
    client = await gateway.add_client(init_integration)
    sim.fail = status
    caplog.set_level(logging.WARNING)
    errors = await every_error(gateway, client.api_key)
    assert len(errors) == 6
    for text in errors:
        assert_no_address(text, sim)
        assert f"answered HTTP {status}" in text
    assert sim.url in caplog.text


async def test_a_server_that_is_down_is_named_not_located(
    gateway: Gateway, init_integration: MockConfigEntry, sim: FailingSim
) -> None:
    """Gone since the last poll (connection refused): 503 naming the server, both APIs."""
    client = await gateway.add_client(init_integration)
    await sim.stop()
    errors = [text async for text in openai_errors(gateway, client.api_key)]
    # The first refused connection marks the server down: the next requests are refused at
    # the door, saying the same server does not answer.
    errors += [text async for text in ollama_errors(gateway, client.api_key)]
    assert "cannot connect to the LLM server 'llama.cpp (sim)'" in errors[0]
    for text in errors:
        assert_no_address(text, sim)


async def test_a_stream_cut_short_ends_naming_the_server(
    gateway: Gateway, init_integration: MockConfigEntry, sim: FailingSim
) -> None:
    """The server dies mid-stream: the stream's error event names it, without its address."""
    client = await gateway.add_client(init_integration)
    api = gateway.openai(client.api_key)
    async with api.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=HELLO,
        stream=True,
        max_tokens=2000,
        extra_body={"ignore_eos": True},
    ) as response:
        lines = response.iter_lines()
        first = await anext(lines)
        assert first.startswith("data: ")
        await sim.kill()
        rest = [line async for line in lines]
    errors: list[dict[str, Any]] = [
        body["error"]
        for line in rest
        if line.startswith("data: {")
        and "error" in (body := json.loads(line.removeprefix("data: ")))
    ]
    assert len(errors) == 1
    assert_no_address(json.dumps(errors[0]), sim)


async def test_every_form_of_an_address_is_replaced(hass: HomeAssistant) -> None:
    """A URL with its path, ``host:port`` and asyncio's ``('host', port)``; a title as it is."""
    title = r"GPU \1 box"  # a backslash: no group reference of a replacement
    MockConfigEntry(
        domain=DOMAIN, title=title, data={CONF_URL: "http://10.0.0.5:8080/v1/"}
    ).add_to_hass(hass)
    MockConfigEntry(
        domain=DOMAIN, title="Mini", data={CONF_URL: "http://mini.lan:11434"}
    ).add_to_hass(hass)
    name = f"the LLM server {title!r}"
    assert hide_addresses(
        hass,
        "cannot connect to http://10.0.0.5:8080/v1/chat/completions: Connect call failed "
        "('10.0.0.5', 8080); host 10.0.0.5:8080. Then http://mini.lan:11434/api/chat.",
    ) == (
        f"cannot connect to {name}: Connect call failed {name}; host {name}. "
        "Then the LLM server 'Mini'."
    )
