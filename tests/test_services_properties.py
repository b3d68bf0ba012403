"""Property: arbitrary JSON sent to any action never crashes it, and a refusal changes nothing.

Hypothesis draws the data of each action: an object of plausible values of its fields (the
required ones always, the others or not), the same with one or two fields (or stray keys) set to
any JSON value at all (nested lists and objects, huge numbers, long and empty strings) and perhaps
one left out, or any JSON value instead of an object. The call goes through Home Assistant's
own service layer (the schema, then the handler) on an entry loaded against the simulated server.

The only errors allowed are Home Assistant's: ``probatio.Invalid`` (the schema),
``ServiceValidationError`` and ``Unauthorized`` (refusals), or a translated
``HomeAssistantError``. After a refusal nothing is stored or created: the jobs, the stored job
document, the entity registry and the requesters the scheduler knows are as they were.

Jobs are paused, so a queued job never runs (and ``wait`` answers at once). ``run_benchmark`` is
called by a non-admin outside the quiet hours, so it is always refused (``apply`` and ``force``
are admin-only, the window is closed) and no calibration loads the server.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from homeassistant.core import Context, HomeAssistant, SupportsResponse
from homeassistant.exceptions import (
    HomeAssistantError,
    ServiceValidationError,
    Unauthorized,
)
from homeassistant.helpers import entity_registry as er
from homeassistant.util import dt as dt_util
from hypothesis import HealthCheck, event, given, settings, strategies as st
import probatio
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser

from custom_components.llm_lanes.const import DOMAIN, OPT_NIGHTLY_END, OPT_NIGHTLY_START
from custom_components.llm_lanes.jobs.store import storage_key
from custom_components.llm_lanes.service_schemas import BUILTIN_SCENARIOS
from custom_components.llm_lanes.services import ACTIONS
from tools.simulator.server import SimulatedServer

from .support.entities import async_call_entity_action, async_set_options
from .support.requests import async_call_action

EXAMPLES = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["", " ", "\n", 1e20, -1, 0, 10**400, "1e400", "99999:00:00"]),
    st.builds(lambda: "x" * 1_000_001),
)
JSON = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


NUMBER = st.integers() | st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(min_size=1, max_size=200)
TOKENS = st.integers(-3, 5000) | NUMBER
BOOL = st.booleans()
REQUESTER = st.sampled_from(
    ["kitchen_tablet", "user:nobody", "device:x", "automation:automation.x", "job:a"]
) | st.text(max_size=140)
FIELDS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # action: (the fields a plausible call always has, those it may have)
    "generate": (
        {"prompt": TEXT},
        {
            "instructions": TEXT,
            "lane": st.sampled_from(
                ["voice", "interactive", "automation", "background"]
            ),
            "requester": REQUESTER,
            "max_tokens": TOKENS,
            "model": st.sampled_from(["sim-llama-8b", "other-model"]),
        },
    ),
    "run_benchmark": (
        {},
        {
            "scenario": st.sampled_from(BUILTIN_SCENARIOS),
            "duration_s": st.floats(-5, 700) | NUMBER,
            "apply": BOOL,
            "force": BOOL,
        },
    ),
    "summarize": (
        {"text": TEXT},
        {
            "name": TEXT,
            "entity_ids": st.lists(
                st.sampled_from(["sensor.door", "light.x"]), min_size=1, max_size=3
            ),
            "look_back": st.sampled_from(["01:00:00", {"hours": 2}, 3600, "-01:00"])
            | NUMBER
            | st.dictionaries(st.sampled_from(["days", "hours", "seconds"]), NUMBER),
            "instructions": TEXT,
            "requester": REQUESTER,
            "max_output_tokens": TOKENS,
            "run_now": BOOL,
            "wait": BOOL,
            "notify_target": st.sampled_from(["notify.nobody", "notify.notify"]),
            "persistent_notification": BOOL,
        },
    ),
    "cancel_job": ({"job_id": st.text(max_size=40)}, {}),
    "list_jobs": (
        {},
        {"status": st.lists(st.sampled_from(["queued", "done", "failed", "late"]))},
    ),
}
RESPONSES = {name: supports for name, _, _, supports in ACTIONS}


def _changed(
    data: dict[str, Any], spoils: list[tuple[str, Any]], dropped: list[str]
) -> dict[str, Any]:
    changed = {**data, **dict(spoils)}
    for key in dropped:
        changed.pop(key, None)
    return changed


def _data(action: str, entry_id: str) -> st.SearchStrategy[Any]:
    """Draw the data of one call of ``action`` (see the module docstring)."""
    required, optional = FIELDS[action]
    entry = st.sampled_from([entry_id] * 5 + ["nope"])
    plausible = st.fixed_dictionaries(
        {"config_entry_id": entry, **required}, optional=optional
    )
    names = st.sampled_from(sorted({"config_entry_id", *required, *optional}))
    spoiled = st.builds(
        _changed,
        plausible,
        st.lists(
            st.tuples(names | names | st.text(max_size=8), LEAVES | LEAVES | JSON),
            min_size=1,
            max_size=2,
        ),
        st.lists(names, max_size=1),
    )
    return st.one_of(plausible, plausible, spoiled, spoiled, JSON)


async def _settle(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """Take a snapshot now (new requesters get their sensor) and let everything finish."""
    await hass.async_block_till_done()
    await entry.runtime_data.activity.async_refresh()
    await hass.async_block_till_done()


def _state(
    hass: HomeAssistant, entry: MockConfigEntry, hass_storage: dict[str, Any]
) -> tuple[Any, ...]:
    """Return what a refusal must leave unchanged."""
    runtime = entry.runtime_data
    stored = hass_storage.get(storage_key(entry.entry_id), {}).get("data", {})
    return (
        sorted(job.id for job in runtime.jobs.jobs()),
        sorted(job["id"] for job in stored.get("jobs", [])),
        sorted(
            registry_entry.unique_id
            for registry_entry in er.async_entries_for_config_entry(
                er.async_get(hass), entry.entry_id
            )
        ),
        sorted(runtime.scheduler.snapshot().requesters),
        runtime.requesters.named_count,
    )


@pytest.fixture
def callers(
    hass_admin_user: MockUser, hass_read_only_user: MockUser
) -> dict[str, MockUser | None]:
    """Return who may call: nobody (an automation), an admin, a non-admin user."""
    return {"none": None, "admin": hass_admin_user, "read-only": hass_read_only_user}


def _context(user: MockUser | None) -> Context:
    return Context(user_id=user.id if user is not None else None)


@pytest.fixture
async def entry(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    sim: SimulatedServer,
    callers: dict[str, MockUser | None],
) -> MockConfigEntry:
    """Load the entry: jobs paused, quiet hours closed for hours, one job of each caller."""
    await async_call_entity_action(
        hass, init_integration, "switch", "jobs_paused", "turn_on"
    )
    opens = (dt_util.now() + timedelta(hours=3)).replace(microsecond=0)
    await async_set_options(
        hass,
        init_integration,
        **{
            OPT_NIGHTLY_START: opens.time().isoformat(),
            OPT_NIGHTLY_END: (opens + timedelta(minutes=1)).time().isoformat(),
        },
    )
    for user in callers.values():
        await async_call_action(
            hass, "summarize", _context(user), text="The lights are on."
        )
    return init_integration


async def _outcome(
    hass: HomeAssistant, action: str, payload: Any, context: Context, *, response: bool
) -> Exception | None:
    """Call the action; return the error it raised, if any (anything else propagates)."""
    try:
        await hass.services.async_call(
            DOMAIN,
            action,
            payload,
            blocking=True,
            context=context,
            return_response=response,
        )
    except (probatio.Invalid, HomeAssistantError) as err:
        return err
    return None


@pytest.mark.parametrize("action", sorted(FIELDS))
@EXAMPLES
@given(data=st.data())
async def test_any_json_is_answered_or_refused_cleanly(  # noqa: PLR0917
    hass: HomeAssistant,
    entry: MockConfigEntry,
    callers: dict[str, MockUser | None],
    hass_storage: dict[str, Any],
    action: str,
    data: st.DataObject,
) -> None:
    """No call crashes; every error is Home Assistant's; a refusal leaves everything as it was."""
    payload = data.draw(_data(action, entry.entry_id), label="data")
    if action == "cancel_job" and isinstance(payload, dict) and data.draw(BOOL):
        jobs = entry.runtime_data.jobs.jobs()
        if jobs:
            payload["job_id"] = data.draw(st.sampled_from([job.id for job in jobs]))
    caller = (
        "read-only"
        if action == "run_benchmark"
        else data.draw(st.sampled_from(sorted(callers)), label="caller")
    )
    supports = RESPONSES[action]
    response = supports is SupportsResponse.ONLY or (
        supports is SupportsResponse.OPTIONAL and data.draw(BOOL, label="response")
    )

    await _settle(hass, entry)
    before = _state(hass, entry, hass_storage)
    err = await _outcome(
        hass, action, payload, _context(callers[caller]), response=response
    )
    await _settle(hass, entry)
    if isinstance(err, probatio.Invalid | ServiceValidationError | Unauthorized):
        event("refused")
        assert _state(hass, entry, hass_storage) == before
    elif err is not None:
        # A failure of the server, not a refusal: translated like every error of ours.
        event(f"failed: {getattr(err, 'translation_key', None)}")
        assert isinstance(err, HomeAssistantError), repr(err)
        assert (err.translation_domain, bool(err.translation_key)) == (DOMAIN, True)
    else:
        event("answered")
