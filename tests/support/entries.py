"""LLM Lanes config entries for servers the tests run (the simulated ones, mostly)."""

from __future__ import annotations

from collections.abc import AsyncIterator
import contextlib
from typing import TYPE_CHECKING, Any

from homeassistant.config_entries import (
    SOURCE_USER,
    ConfigEntry,
    ConfigEntryState,
    ConfigFlowResult,
)
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import CONF_KIND, CONF_MODEL, DOMAIN
from tools.simulator.server import SimConfig

if TYPE_CHECKING:
    from tests.support.llamacpp import LlamaServer

MODEL = SimConfig().model
FAST_SIM = SimConfig(slots=2, speed=50.0)
"""The simulated llama.cpp of most tests: two slots, fifty times its real speed."""
REAL_SPEED_SIM = SimConfig(slots=2, speed=1.0)
"""A simulated llama.cpp at its real pace (about a second for 100 tokens): a long answer lasts."""


def server_entry(
    url: str,
    kind: str,
    *,
    model: str = MODEL,
    api_key: str | None = None,
    title: str | None = None,
    **entry: Any,
) -> MockConfigEntry:
    """Build the entry of the ``kind`` server at ``url`` (``entry``: more MockConfigEntry fields)."""
    data = {CONF_URL: url, CONF_KIND: kind, CONF_MODEL: model}
    if api_key is not None:
        data[CONF_API_KEY] = api_key
    return MockConfigEntry(
        domain=DOMAIN, title=title or f"{kind} (sim)", data=data, **entry
    )


async def async_set_up(
    hass: HomeAssistant, entry: MockConfigEntry, *, loaded: bool = True
) -> MockConfigEntry:
    """Add the entry and set it up (``loaded``: whether that must succeed); let it settle."""
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id) is loaded
    await hass.async_block_till_done(wait_background_tasks=True)
    if loaded:
        assert entry.state is ConfigEntryState.LOADED
    return entry


async def async_start_subentry_flow(
    hass: HomeAssistant, entry: ConfigEntry, subentry_type: str
) -> ConfigFlowResult:
    """Open the form that adds a subentry of ``subentry_type`` to ``entry``, as the UI's Add does."""
    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, subentry_type), context={"source": SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "user"
    return result


@contextlib.asynccontextmanager
async def async_llama_entry(
    hass: HomeAssistant, server: LlamaServer, title: str, **entry: Any
) -> AsyncIterator[MockConfigEntry]:
    """Set up an entry for a real llama-server (``entry``: more of its fields); unload it after."""
    config = server_entry(
        server.url, "llama_cpp", model=server.model_name, title=title, **entry
    )
    yield await async_set_up(hass, config)
    if config.state is ConfigEntryState.LOADED:
        assert await hass.config_entries.async_unload(config.entry_id)
