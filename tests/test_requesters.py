"""Requester ids and the helpers that decide who is charged."""

from __future__ import annotations

from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.common import MockUser

from custom_components.llm_lanes.core.backends.base import ServerInfo
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.requesters import (
    JOBS_REQUESTER,
    OTHER_REQUESTER,
    REQUESTER_MAX_LENGTH,
    RequesterRegistry,
    automation_for_context,
    is_requester_id,
    job_requester,
    requester_for_context,
)
from custom_components.llm_lanes.served_model import model_is_loaded


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


async def test_the_registry_keeps_lasting_requesters_and_folds_the_rest(
    hass: HomeAssistant, hass_admin_user: MockUser
) -> None:
    """Known users, devices and automations always; named ones up to the limit; else other."""
    registry = RequesterRegistry(["job:restored", "bad id"], limit=3)
    assert registry.named_count == 1
    user = f"user:{hass_admin_user.id}"
    assert await registry.async_charge_as(hass, user) == user
    assert await registry.async_charge_as(hass, "user:nobody") == OTHER_REQUESTER
    hass.states.async_set("automation.lights", "on")
    assert (
        await registry.async_charge_as(hass, "automation:automation.lights")
        == "automation:automation.lights"
    )
    assert (
        await registry.async_charge_as(hass, "automation:automation.gone")
        == OTHER_REQUESTER
    )
    assert await registry.async_charge_as(hass, "device:nope") == OTHER_REQUESTER
    hass.states.async_set("light.kitchen", "on")
    assert (
        await registry.async_charge_as(hass, "automation:light.kitchen")
        == OTHER_REQUESTER
    )
    for malformed in ("", "two words", "x" * 129, "tab\there"):
        assert await registry.async_charge_as(hass, malformed) == OTHER_REQUESTER

    assert await registry.async_charge_as(hass, "job:a") == "job:a"
    assert await registry.async_charge_as(hass, "client:ui") == "client:ui"
    assert registry.named_count == 3
    assert await registry.async_charge_as(hass, "kitchen") == OTHER_REQUESTER
    assert await registry.async_charge_as(hass, "job:a") == "job:a"  # still kept
    assert await registry.async_charge_as(hass, "generate") == "generate"
    registry.allow(["kitchen", "user:someone"])
    assert await registry.async_charge_as(hass, "kitchen") == "kitchen"
    assert registry.named_count == 4  # users are not named requesters


def test_job_requesters_are_slugs() -> None:
    """A job's name becomes a bounded, well-formed id; no name is the one ``job`` requester."""
    assert job_requester("Evening digest") == "job:evening_digest"
    assert job_requester(None) == JOBS_REQUESTER
    assert job_requester("!!!") == "job:unknown"
    assert len(job_requester("n" * 500)) <= REQUESTER_MAX_LENGTH
    assert is_requester_id(job_requester("Résumé du soir: ça va?"))
