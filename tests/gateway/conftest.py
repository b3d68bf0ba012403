"""Fixtures of the gateway tests: Home Assistant's HTTP server on a real port, real clients.

Home Assistant's ``http`` component is set up first (with the login-attempt ban on), then the
simulated server's entry; ``gateway`` starts the test HTTP server on loopback (the one
``hass_client`` uses) and makes the real ``openai`` and ``ollama`` clients for it. Clients
(``client`` subentries) are added while the entry runs, as the UI adds them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from aiohttp import web
from homeassistant.config_entries import ConfigEntry, ConfigSubentry
from homeassistant.const import CONF_API_KEY, EVENT_HOMEASSISTANT_STOP
from homeassistant.core import Event, HomeAssistant
from homeassistant.setup import async_setup_component
import ollama
import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import CONF_LANE, DOMAIN, SUBENTRY_CLIENT
from custom_components.llm_lanes.gateway.clients import (
    OLLAMA_PATH,
    OPENAI_PATH,
    new_api_key,
)
from custom_components.llm_lanes.requesters import client_requester
from tests.support.entries import async_llama_entry
from tests.support.llamacpp import LlamaServer
from tools.simulator.server import SimConfig, SimulatedServer

from .sim import GatewaySim

LOGIN_THRESHOLD = 3
"""Failed logins from one address before Home Assistant bans it."""
TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ClientKey:
    """A client added to an entry: its subentry, key and requester."""

    subentry_id: str
    api_key: str

    @property
    def requester(self) -> str:
        """Who its tokens are charged to."""
        return client_requester(self.subentry_id)


@dataclass
class Gateway:
    """Home Assistant's HTTP server on loopback, and real clients of its two endpoints."""

    hass: HomeAssistant
    url: str
    """``http://127.0.0.1:<port>``"""
    _closing: list[Any] = field(default_factory=list)

    @property
    def openai_url(self) -> str:
        """The OpenAI-compatible base URL."""
        return f"{self.url}{OPENAI_PATH}"

    def ollama_url(self, api_key: str) -> str:
        """Return the Ollama-compatible host URL of a key."""
        return f"{self.url}{OLLAMA_PATH}/{api_key}"

    def openai(self, api_key: str) -> openai.AsyncOpenAI:
        """Make an OpenAI client with ``api_key`` (no retries: a test sees every answer)."""
        client = openai.AsyncOpenAI(
            base_url=self.openai_url, api_key=api_key, max_retries=0, timeout=TIMEOUT_S
        )
        self._closing.append(client)
        return client

    def ollama(self, api_key: str) -> ollama.AsyncClient:
        """Make an Ollama client of a key's host URL."""
        client = ollama.AsyncClient(host=self.ollama_url(api_key), timeout=TIMEOUT_S)
        self._closing.append(client)
        return client

    async def add_client(
        self,
        entry: ConfigEntry,
        name: str = "Open WebUI",
        lane: str = "interactive",
        **data: Any,
    ) -> ClientKey:
        """Add a client subentry to a running entry, as the UI does (no reload)."""
        api_key = new_api_key()
        subentry = ConfigSubentry(
            data=MappingProxyType({CONF_LANE: lane, CONF_API_KEY: api_key, **data}),
            subentry_type=SUBENTRY_CLIENT,
            title=name,
            unique_id=None,
        )
        self.hass.config_entries.async_add_subentry(entry, subentry)
        await self.hass.async_block_till_done()
        return ClientKey(subentry.subentry_id, api_key)

    async def add_openai_client(
        self, entry: ConfigEntry, **client: Any
    ) -> tuple[ClientKey, openai.AsyncOpenAI]:
        """Add a client (``add_client``) and make an OpenAI client with its key."""
        key = await self.add_client(entry, **client)
        return key, self.openai(key.api_key)

    async def add_ollama_client(
        self, entry: ConfigEntry, **client: Any
    ) -> tuple[ClientKey, ollama.AsyncClient]:
        """Add a client (``add_client``) and make an Ollama client of its host URL."""
        key = await self.add_client(entry, **client)
        return key, self.ollama(key.api_key)

    async def close(self) -> None:
        """Close every client made."""
        for client in self._closing:
            await client.close()


@pytest.fixture(params=["llama_cpp", "ollama"])
def sim_config(request: pytest.FixtureRequest) -> SimConfig:
    """Run each gateway test in front of both kinds of server (either API, translated)."""
    return SimConfig(kind=request.param, slots=2, speed=50.0)


@pytest.fixture
def sim_server_class() -> type[SimulatedServer]:
    """Serve raw completions and embeddings too."""
    return GatewaySim


@pytest.fixture(autouse=True)
async def http_with_ban(hass: HomeAssistant) -> None:
    """Set up Home Assistant's HTTP component with the login-attempt ban on, before the entry."""
    assert await async_setup_component(
        hass,
        "http",
        {"http": {"ip_ban_enabled": True, "login_attempts_threshold": LOGIN_THRESHOLD}},
    )


@pytest.fixture
def handler_cancellation() -> bool:
    """Whether the HTTP server cancels a handler whose client disconnects.

    Home Assistant's own server does, as aiohttp's test server does; an aiohttp server does not
    by default, and the gateway then notices the disconnect itself. Tests of disconnects run
    both ways.
    """
    return True


@pytest.fixture
async def gateway(
    ha_core: HomeAssistant, socket_enabled: None, handler_cancellation: bool
) -> AsyncIterator[Gateway]:
    """Serve Home Assistant's HTTP app on loopback; its real clients are closed afterwards.

    The app runs as Home Assistant runs it (``AppRunner``), on a free loopback port, and stops
    as Home Assistant stops it: on its stop event, after waiting for the handlers (here for at
    most a second, not Home Assistant's 10). As in the harness's ``aiohttp_client``, the router
    is kept unfrozen so that integrations set up later can still add views.
    """
    hass = ha_core
    assert await async_setup_component(hass, DOMAIN, {})
    hass.http.app._router.freeze = lambda: None  # type: ignore[method-assign]
    runner = web.AppRunner(
        hass.http.app, handler_cancellation=handler_cancellation, shutdown_timeout=1
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]

    async def stop_server(_: Event) -> None:
        await runner.cleanup()

    stopped = hass.bus.async_listen_once(EVENT_HOMEASSISTANT_STOP, stop_server)
    gateway = Gateway(hass, f"http://127.0.0.1:{port}")
    yield gateway
    await gateway.close()
    if runner.server is not None:  # Home Assistant did not stop
        stopped()
        await runner.cleanup()


@pytest.fixture
async def llama_entry(
    hass: HomeAssistant, gateway: Gateway, llama_server: LlamaServer
) -> AsyncIterator[MockConfigEntry]:
    """Set up an LLM Lanes entry for the real server (after the gateway's app runs), defaults."""
    async with async_llama_entry(hass, llama_server, "llama.cpp (real)") as entry:
        yield entry
