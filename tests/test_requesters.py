"""Requester ids and the helpers that decide who is charged."""

from __future__ import annotations

from homeassistant.core import Context, HomeAssistant

from custom_components.llm_lanes.coordinator import model_is_loaded
from custom_components.llm_lanes.core.backends.base import (
    ServerInfo,
    ServerKind,
    ServerMetrics,
)
from custom_components.llm_lanes.requesters import (
    automation_for_context,
    job_requester,
    requester_for_context,
)


async def test_requester_for_context(hass: HomeAssistant) -> None:
    """User first, then the automation whose run it is (or its parent), then the default."""
    assert requester_for_context(hass, None, "x") == "x"
    assert requester_for_context(hass, Context(user_id="u"), "x") == "user:u"
    run = Context()
    hass.states.async_set("automation.lights", "on", context=run)
    child = Context(parent_id=run.id)
    assert automation_for_context(hass, child) == "automation.lights"
    assert requester_for_context(hass, child, "x") == "automation:automation.lights"
    assert requester_for_context(hass, Context(), "x") == "x"
    assert job_requester("nightly") == "job:nightly"


def test_model_is_loaded() -> None:
    """Residency when the server reports it, else whether the server serves the model."""
    info = ServerInfo(
        kind=ServerKind.LLAMA_CPP, version="1", models=("a", "b"), unique_id="id"
    )
    assert model_is_loaded("a", info, ServerMetrics())
    assert not model_is_loaded("c", info, ServerMetrics())
    assert not model_is_loaded("a", info, ServerMetrics(loaded_models=("b",)))
    assert model_is_loaded("b", info, ServerMetrics(loaded_models=("b",)))
