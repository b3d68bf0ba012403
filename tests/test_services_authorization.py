"""Who may do what: real admin and non-admin users of Home Assistant's test harness.

A non-admin is charged as themself whatever ``requester`` they give, sees and cancels only their
own jobs, and may neither apply a benchmark's settings nor force one outside the quiet hours, nor
change a setting through the server's controls (numbers, select, switches): the settings are an
admin's, as the options. An admin, and a call without a user (an automation), may do all of it.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from homeassistant.auth.const import GROUP_ID_USER
from homeassistant.components.number import ATTR_VALUE, SERVICE_SET_VALUE
from homeassistant.components.select import ATTR_OPTION, SERVICE_SELECT_OPTION
from homeassistant.const import ATTR_ENTITY_ID, SERVICE_TURN_ON
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import ServiceValidationError, Unauthorized, UnknownUser
from homeassistant.setup import async_setup_component
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.llm_lanes.const import (
    OPT_BACKGROUND_PAUSED,
    OPT_BACKGROUND_SHARE,
    OPT_MAX_SEQUENCES,
    OPT_POLICY,
)
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.jobs.model import JobStatus

from .support.entities import async_call_entity_action, async_set_options, entity_id_for
from .support.requests import async_call_action, finished_requests


def _as(user: MockUser) -> Context:
    return Context(user_id=user.id)


@pytest.fixture
async def hass_user(hass: HomeAssistant, hass_admin_user: MockUser) -> MockUser:
    """Return a user of Home Assistant's *Users* group: may control entities, is no admin."""
    group = await hass.auth.async_get_group(GROUP_ID_USER)
    assert group is not None
    return MockUser(groups=[group]).add_to_hass(hass)


@pytest.fixture
async def manager(hass: HomeAssistant, init_integration: MockConfigEntry) -> JobManager:
    """Return the job manager of the loaded entry, with jobs paused (they stay queued)."""
    await async_call_entity_action(
        hass, init_integration, "switch", "jobs_paused", "turn_on"
    )
    return init_integration.runtime_data.jobs


async def test_a_non_admin_may_not_change_settings_through_a_benchmark(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_read_only_user: MockUser,
    hass_admin_user: MockUser,
) -> None:
    """``apply`` and ``force`` need an admin; nothing runs and the options stay as they were."""
    options = dict(init_integration.options)
    data: dict[str, Any] = {
        "config_entry_id": init_integration.entry_id,
        "duration_s": 1,
    }
    for flags in ({"apply": True}, {"force": True}, {"apply": True, "force": True}):
        with pytest.raises(Unauthorized):
            await async_call_action(
                hass, "run_benchmark", _as(hass_read_only_user), **data, **flags
            )
    assert dict(init_integration.options) == options

    # An admin gets past the check (and meets the quiet hours, set to a closed window here).
    await async_set_options(
        hass, init_integration, nightly_start="03:00:00", nightly_end="03:00:01"
    )
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(
            hass, "run_benchmark", _as(hass_admin_user), **data, apply=True
        )
    assert err.value.translation_key == "outside_quiet_hours"


CONTROLS = [
    ("number", OPT_MAX_SEQUENCES, SERVICE_SET_VALUE, {ATTR_VALUE: 1}),
    ("number", OPT_BACKGROUND_SHARE, SERVICE_SET_VALUE, {ATTR_VALUE: 50}),
    ("select", OPT_POLICY, SERVICE_SELECT_OPTION, {ATTR_OPTION: "fifo"}),
    ("switch", OPT_BACKGROUND_PAUSED, SERVICE_TURN_ON, {}),
    ("switch", "jobs_paused", SERVICE_TURN_ON, {}),
]
"""Every control of a server: platform, key, action and its data (each changes a setting)."""


async def _control(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    control: tuple[str, str, str, dict[str, Any]],
    context: Context | None,
) -> None:
    platform, key, action, data = control
    await hass.services.async_call(
        platform,
        action,
        {ATTR_ENTITY_ID: entity_id_for(hass, entry, platform, key), **data},
        blocking=True,
        context=context,
    )
    await hass.async_block_till_done()


@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: f"{c[0]}.{c[1]}")
async def test_only_an_admin_changes_settings_through_the_controls(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_user: MockUser,
    hass_admin_user: MockUser,
    control: tuple[str, str, str, dict[str, Any]],
) -> None:
    """A user who may control entities but is no admin is refused, translated; nothing changes.

    An admin's change and an automation's (no user) go through, as in the options flow.
    """
    entry = init_integration
    manager = entry.runtime_data.jobs
    options, settings = dict(entry.options), entry.runtime_data.scheduler.settings

    with pytest.raises(Unauthorized) as err:
        await _control(hass, entry, control, _as(hass_user))
    assert err.value.translation_domain == "llm_lanes"
    assert err.value.translation_key == "admin_only"
    assert "Only an administrator" in str(err.value)
    assert dict(entry.options) == options
    assert entry.runtime_data.scheduler.settings is settings
    assert not manager.paused

    await _control(hass, entry, control, _as(hass_admin_user))
    assert dict(entry.options) != options or manager.paused

    hass.config_entries.async_update_entry(entry, options=options)
    manager.set_paused(False)
    await hass.async_block_till_done()
    await _control(hass, entry, control, None)
    assert dict(entry.options) != options or manager.paused


async def test_a_non_admin_is_charged_as_themself(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_read_only_user: MockUser,
    hass_admin_user: MockUser,
    manager: JobManager,
) -> None:
    """The ``requester`` a non-admin gives is ignored: their own quota applies to them."""
    entry_id = init_integration.entry_id
    own = f"user:{hass_read_only_user.id}"
    await async_set_options(
        hass,
        init_integration,
        requester_quotas=f"{own}=1",
        quota_action="reject",
    )
    finished = finished_requests(init_integration)
    answer = await async_call_action(
        hass,
        "generate",
        _as(hass_read_only_user),
        config_entry_id=entry_id,
        prompt="Hi",
        requester=f"user:{hass_admin_user.id}",
        max_tokens=4,
    )
    assert answer["requester"] == own
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(
            hass,
            "generate",
            _as(hass_read_only_user),
            config_entry_id=entry_id,
            prompt="Hi again",
            requester="someone_else",
        )
    assert err.value.translation_key == "quota_exceeded"
    assert {request.requester for request in finished} == {own}

    job = await async_call_action(
        hass,
        "summarize",
        _as(hass_read_only_user),
        text="The heating ran.",
        name="heating",
        requester="job:heating",
    )
    assert job["requester"] == own

    # An admin's requester is kept.
    answer = await async_call_action(
        hass,
        "generate",
        _as(hass_admin_user),
        config_entry_id=entry_id,
        prompt="Hi",
        requester="kitchen_tablet",
        max_tokens=4,
    )
    assert answer["requester"] == "kitchen_tablet"


async def test_a_non_admin_sees_and_cancels_only_their_own_jobs(
    hass: HomeAssistant,
    hass_read_only_user: MockUser,
    hass_admin_user: MockUser,
    manager: JobManager,
) -> None:
    """``list_jobs`` shows a non-admin their jobs only; another's job is not found to cancel."""
    admins = await async_call_action(
        hass, "summarize", _as(hass_admin_user), text="Admin's text."
    )
    mine = await async_call_action(
        hass, "summarize", _as(hass_read_only_user), text="My text."
    )
    automations = await async_call_action(hass, "summarize", text="An automation's.")

    listed = await async_call_action(hass, "list_jobs", _as(hass_read_only_user))
    assert [job["job_id"] for job in listed["jobs"]] == [mine["job_id"]]
    assert listed["jobs"][0]["user_id"] == hass_read_only_user.id
    for caller in (_as(hass_admin_user), None):
        listed = await async_call_action(hass, "list_jobs", caller)
        assert {job["job_id"] for job in listed["jobs"]} == {
            admins["job_id"],
            mine["job_id"],
            automations["job_id"],
        }

    for others in (admins, automations):
        with pytest.raises(ServiceValidationError) as err:
            await async_call_action(
                hass, "cancel_job", _as(hass_read_only_user), job_id=others["job_id"]
            )
        assert err.value.translation_key == "job_not_found"
        assert manager.get(others["job_id"]).status is JobStatus.QUEUED

    cancelled = await async_call_action(
        hass, "cancel_job", _as(hass_read_only_user), job_id=mine["job_id"]
    )
    assert cancelled["status"] == "cancelled"
    cancelled = await async_call_action(
        hass, "cancel_job", _as(hass_admin_user), job_id=automations["job_id"]
    )
    assert cancelled["status"] == "cancelled"


@pytest.mark.usefixtures("manager")
async def test_an_unknown_user_is_refused(hass: HomeAssistant) -> None:
    """A context naming no user is Home Assistant's ``UnknownUser``; nothing is queued."""
    with pytest.raises(UnknownUser):
        await async_call_action(
            hass, "summarize", Context(user_id="no-such-user"), text="x"
        )


async def test_a_rest_caller_who_may_not_is_told_401(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_client: ClientSessionGenerator,
    hass_read_only_access_token: str,
) -> None:
    """Home Assistant's REST API answers ``Unauthorized`` with HTTP 401."""
    assert await async_setup_component(hass, "api", {})
    client = await hass_client(hass_read_only_access_token)
    response = await client.post(
        "/api/services/llm_lanes/run_benchmark?return_response",
        json={"config_entry_id": init_integration.entry_id, "apply": True},
    )
    assert response.status == HTTPStatus.UNAUTHORIZED
