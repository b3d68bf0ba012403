"""Shared fixtures: Home Assistant, a simulated LLM server and an LLM Lanes entry for it.

Home Assistant's test harness puts its own test config folder (with an empty ``custom_components``)
first on ``sys.path``; importing from our package here, at import time, makes sure ours is the one
found.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
import logging
import re
from unittest.mock import PropertyMock, patch

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.syrupy import HomeAssistantSnapshotExtension
from syrupy.assertion import SnapshotAssertion

from custom_components.llm_lanes.const import (
    CONF_LLM_HASS_API,
    CONF_MODEL,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from tools.simulator.server import SimConfig, SimulatedServer

from .support.entries import FAST_SIM, async_set_up, server_entry
from .support.llamacpp import LlamaServer, session_llama_server

ENTRY_ID = "01JLLMLANESSIMENTRY0000000"
"""The simulated server's entry id, fixed so that unique ids (and snapshots) are the same every run."""


def pytest_configure(config: pytest.Config) -> None:
    """Keep syrupy's snapshots in a ``snapshots/`` folder beside their tests (not ``__snapshots__``)."""
    config.option.snapshot_dirname = "snapshots"


USAGE_REPORT = re.compile(
    r"Detected that (custom )?integration 'llm_lanes'|deprecated.*\bllm_lanes\b"
)
"""A Home Assistant log line about our code: its frame helper's ``report_usage`` (deprecations and
misuse, logged rather than warned for custom integrations), or a deprecation helper naming us."""


class UsageReports(logging.Handler):
    """Collects the log lines in which Home Assistant reports a deprecated or wrong use by us."""

    def __init__(self) -> None:
        """Collect from WARNING up."""
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the line when it names llm_lanes as the one at fault."""
        message = record.getMessage()
        if USAGE_REPORT.search(message):
            self.lines.append(message)


@pytest.fixture(autouse=True)
def usage_reports() -> Iterator[UsageReports]:
    """Fail the test in which Home Assistant reports a deprecated (or wrong) use by llm_lanes.

    Home Assistant logs these for a custom integration instead of raising (``report_usage``), so
    no warning filter sees them. A test that provokes one on purpose clears ``lines``.
    """
    reports = UsageReports()
    root = logging.getLogger()
    root.addHandler(reports)
    try:
        yield reports
    finally:
        root.removeHandler(reports)
    if reports.lines:
        pytest.fail(
            "Home Assistant reported a deprecated use by llm_lanes:\n"
            + "\n".join(reports.lines),
            pytrace=False,
        )


@pytest.fixture
def snapshot(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    """Serialize Home Assistant objects as core's tests do (registry ids and timestamps left out).

    The test package ships this fixture too, but syrupy's own plugin, loaded after it, wins.
    """
    return snapshot.use_extension(HomeAssistantSnapshotExtension)


@pytest.fixture(autouse=True)
def auto_enable_custom_integrations(request: pytest.FixtureRequest) -> None:
    """Let Home Assistant load custom integrations in every test that starts one.

    Engine tests (``tests/core``) never touch ``hass``, so they do not pay for starting it.
    """
    if "hass" in request.fixturenames:
        request.getfixturevalue("enable_custom_integrations")


@pytest.fixture
def entity_registry_enabled_by_default() -> Generator[None]:
    """Create every entity enabled, including those disabled by default (as HA core's tests do)."""
    with patch(
        "homeassistant.helpers.entity.Entity.entity_registry_enabled_default",
        new_callable=PropertyMock,
        return_value=True,
    ):
        yield


@pytest.fixture
async def ha_core(hass: HomeAssistant) -> HomeAssistant:
    """Home Assistant with its core integration set up (conversation needs exposed entities)."""
    assert await async_setup_component(hass, "homeassistant", {})
    return hass


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """Run a real llama-server (``--parallel 4``, 1,024 tokens a slot) for the session's tests.

    Built from source on first use; one server serves every test that asks for it.
    """
    yield from session_llama_server()


# --- LLM Lanes entries against the simulated server ----------------------------------------------


@pytest.fixture
def sim_config() -> SimConfig:
    """How the simulated server of a test looks (a module overrides this, or parametrizes it).

    Shared looks are in ``tests.support.entries`` (``FAST_SIM``, ``REAL_SPEED_SIM``).
    """
    return FAST_SIM


@pytest.fixture
def sim_server_class() -> type[SimulatedServer]:
    """Serve the simulator's own endpoints (a folder whose tests need more overrides this)."""
    return SimulatedServer


@pytest.fixture
async def sim(
    sim_config: SimConfig,
    sim_server_class: type[SimulatedServer],
    socket_enabled: None,
) -> AsyncIterator[SimulatedServer]:
    """Run a simulated LLM server on loopback (sockets allowed for the test)."""
    async with sim_server_class(sim_config) as server:
        yield server


@pytest.fixture
def mock_config_entry(sim: SimulatedServer, sim_config: SimConfig) -> MockConfigEntry:
    """Build an LLM Lanes entry for the simulated server, with one agent and one AI Task entity."""
    return server_entry(
        sim.url,
        sim_config.kind,
        model=sim_config.model,
        title="llama.cpp (sim)",
        entry_id=ENTRY_ID,
        unique_id=f"{sim_config.kind}@127.0.0.1:{sim.port}",
        subentries_data=[
            {
                "subentry_type": SUBENTRY_CONVERSATION,
                "data": {CONF_MODEL: sim_config.model, CONF_LLM_HASS_API: ["assist"]},
                "subentry_id": "conversation_1",
                "title": "Sim agent",
                "unique_id": None,
            },
            {
                "subentry_type": SUBENTRY_AI_TASK,
                "data": {CONF_MODEL: sim_config.model},
                "subentry_id": "ai_task_1",
                "title": "Sim AI Task",
                "unique_id": None,
            },
        ],
    )


@pytest.fixture
async def init_integration(
    ha_core: HomeAssistant, mock_config_entry: MockConfigEntry
) -> AsyncIterator[MockConfigEntry]:
    """Set up the simulated server's entry; unload it after the test, before the server stops.

    A stream still open then (a nightly job that started because the test ran inside the run
    window) would otherwise hold the simulated server's shutdown until the stream times out.
    """
    yield await async_set_up(ha_core, mock_config_entry)
    if mock_config_entry.state is ConfigEntryState.LOADED:
        assert await ha_core.config_entries.async_unload(mock_config_entry.entry_id)
