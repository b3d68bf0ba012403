"""The blueprints in blueprints/automation/llm_lanes/: valid for Home Assistant, and they work.

Each one passes Home Assistant's blueprint schema, then runs as a real automation made from it
against the simulated server's entry.
"""

from __future__ import annotations

from pathlib import Path
import shutil
from typing import Any

from homeassistant.components.automation.config import AUTOMATION_BLUEPRINT_SCHEMA
from homeassistant.components.blueprint import Blueprint
from homeassistant.components.recorder import Recorder
from homeassistant.const import (
    ATTR_DEVICE_CLASS,
    ATTR_ENTITY_ID,
    ATTR_UNIT_OF_MEASUREMENT,
    STATE_UNKNOWN,
)
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from homeassistant.util.yaml import load_yaml_dict
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_mock_service,
)

from .support.entities import entity_id_for, state_of
from .support.requests import async_wait_for

BLUEPRINTS = Path(__file__).resolve().parents[1] / "blueprints" / "automation"
PAUSE = "llm_lanes/llm_slow_pause_background.yaml"
DIGEST = "llm_lanes/nightly_digest_to_phone.yaml"


@pytest.fixture(autouse=True)
def auto_enable_custom_integrations(
    request: pytest.FixtureRequest, recorder_db_url: str
) -> None:
    """Replace the shared autouse fixture: the recorder's database must exist before ``hass``."""
    if "hass" in request.fixturenames:
        request.getfixturevalue("enable_custom_integrations")


def test_blueprints_are_shipped() -> None:
    """The two blueprints the README names."""
    assert sorted(
        str(path.relative_to(BLUEPRINTS)) for path in BLUEPRINTS.rglob("*.yaml")
    ) == [PAUSE, DIGEST]


@pytest.mark.parametrize("path", [PAUSE, DIGEST])
def test_blueprint_passes_home_assistants_schema(path: str) -> None:
    """Home Assistant's automation blueprint schema accepts it; every !input is declared."""
    blueprint = Blueprint(
        load_yaml_dict(BLUEPRINTS / path),
        path=path,
        expected_domain="automation",
        schema=AUTOMATION_BLUEPRINT_SCHEMA,
    )
    assert blueprint.validate() is None
    assert blueprint.name


async def _automation_from(
    hass: HomeAssistant, tmp_path: Path, path: str, inputs: dict[str, Any]
) -> str:
    """Set up an automation from the blueprint (copied into a config folder); its entity id."""
    hass.config.config_dir = str(tmp_path)
    target = tmp_path / "blueprints" / "automation" / path
    target.parent.mkdir(parents=True)
    shutil.copy(BLUEPRINTS / path, target)
    assert await async_setup_component(
        hass,
        "automation",
        {
            "automation": {
                "id": "from_blueprint",
                "alias": "From blueprint",
                "use_blueprint": {"path": path, "input": inputs},
            }
        },
    )
    await hass.async_block_till_done()
    state = hass.states.get("automation.from_blueprint")
    assert state is not None
    assert state.state == "on", state.attributes
    return state.entity_id


def _offered(hass: HomeAssistant, selector_filter: dict[str, Any]) -> set[str]:
    """Return the entities an entity selector's filter offers, as the frontend filters them.

    An entity is offered when its integration, domain and device class (the state's attribute)
    are those the filter names (``integration``, ``domain``, ``device_class``).
    """
    registry = er.async_get(hass)
    offered = set()
    for state in hass.states.async_all():
        entry = registry.async_get(state.entity_id)
        if (
            (entry is not None and entry.platform == selector_filter["integration"])
            and state.domain in _as_list(selector_filter.get("domain", state.domain))
            and state.attributes.get(ATTR_DEVICE_CLASS)
            in _as_list(
                selector_filter.get(
                    "device_class", state.attributes.get(ATTR_DEVICE_CLASS)
                )
            )
        ):
            offered.add(state.entity_id)
    return offered


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


async def test_the_switch_picker_offers_only_background_paused(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Of a server's switches (Background paused, Jobs paused), the input offers the first."""
    blueprint = load_yaml_dict(BLUEPRINTS / PAUSE)["blueprint"]
    (selector_filter,) = blueprint["input"]["background_switch"]["selector"]["entity"][
        "filter"
    ]
    entry = init_integration
    assert _offered(hass, selector_filter) == {
        entity_id_for(hass, entry, "switch", "background_paused")
    }
    # Without its device class, Jobs paused would be offered too.
    assert entity_id_for(hass, entry, "switch", "jobs_paused") in _offered(
        hass, {key: selector_filter[key] for key in ("integration", "domain")}
    )


async def test_llm_slow_pauses_background_until_it_recovers(
    hass: HomeAssistant, init_integration: MockConfigEntry, tmp_path: Path
) -> None:
    """A slow voice lane turns Background paused on; recovered (or no samples left), off."""
    entry = init_integration
    latency = entity_id_for(hass, entry, "sensor", "voice_ttft_p95")
    switch = entity_id_for(hass, entry, "switch", "background_paused")
    await _automation_from(
        hass,
        tmp_path,
        PAUSE,
        {
            "latency_sensor": latency,
            "limit": 1500,
            "slow_for": {"seconds": 0},
            "recovered_for": {"seconds": 0},
            "background_switch": switch,
        },
    )
    scheduler = entry.runtime_data.scheduler
    unit = {ATTR_UNIT_OF_MEASUREMENT: "ms"}

    for value, paused in (("900", False), ("2500", True), ("300", False)):
        hass.states.async_set(latency, value, unit)
        await hass.async_block_till_done()
        assert state_of(hass, entry, "switch", "background_paused") == (
            "on" if paused else "off"
        ), value
        assert scheduler.settings.background_paused is paused

    hass.states.async_set(latency, "2500", unit)
    await hass.async_block_till_done()
    assert scheduler.settings.background_paused is True
    # Voice went quiet: the window holds no sample, the sensor is unknown; work resumes.
    hass.states.async_set(latency, STATE_UNKNOWN, unit)
    await hass.async_block_till_done()
    assert scheduler.settings.background_paused is False
    await _async_turn_off(hass)


async def test_nightly_digest_is_summarized_and_sent_to_the_phone(
    recorder_mock: Recorder,
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    tmp_path: Path,
) -> None:
    """At its time the digest runs now, in the background lane, and the phone gets it."""
    entry = init_integration
    phone = async_mock_service(hass, "notify", "mobile_app_phone")
    hass.states.async_set("lock.front_door", "locked", {"friendly_name": "Front door"})
    await hass.async_block_till_done()
    automation = await _automation_from(
        hass,
        tmp_path,
        DIGEST,
        {
            "server": entry.entry_id,
            "at": "07:00:00",
            "entities": ["lock.front_door"],
            "notify_target": "notify.mobile_app_phone",
        },
    )
    await hass.services.async_call(
        "automation", "trigger", {ATTR_ENTITY_ID: automation}, blocking=True
    )
    jobs = entry.runtime_data.jobs
    await async_wait_for(lambda: bool(phone))
    (call,) = phone
    assert call.data["title"] == "Nightly digest"
    assert call.data["message"]
    (job,) = jobs.jobs()
    assert job.status == "done"
    assert job.requester == "job:nightly_digest"
    await _async_turn_off(hass)


async def _async_turn_off(hass: HomeAssistant) -> None:
    """Stop the automation's triggers (a time trigger would outlive the test)."""
    await hass.services.async_call(
        "automation",
        "turn_off",
        {ATTR_ENTITY_ID: "automation.from_blueprint"},
        blocking=True,
    )
