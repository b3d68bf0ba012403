"""The actions refuse bad input up front, with the numbers, before anything is stored or sent.

Malformed values are schema errors (never a traceback); a prompt that cannot fit the lane or the
server's context per slot is refused with its size and the limit; a full queue and a spent quota
reach a REST caller as HTTP 400 with their translated message, a server that is down as HTTP 500.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError
from homeassistant.setup import async_setup_component
import probatio
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.llm_lanes.core.lanes import LANES
from custom_components.llm_lanes.jobs.manager import JobManager
from tools.simulator.server import SimConfig, SimulatedServer

from .support.entities import async_set_options
from .support.requests import async_call_action

CONTEXT_PER_SLOT = 2048


@pytest.fixture
def sim_config() -> SimConfig:
    """Simulate a server whose slots hold 2,048 tokens each (less than the lanes' limits)."""
    return SimConfig(slots=2, speed=50.0, kv_capacity_tokens=2 * CONTEXT_PER_SLOT)


@pytest.fixture
def manager(init_integration: MockConfigEntry) -> JobManager:
    """Return the loaded entry's job manager."""
    return init_integration.runtime_data.jobs


def _words(tokens: int) -> str:
    """Return a text of about ``tokens`` tokens (the engine's estimate: 4 characters each)."""
    return "abc " * tokens


# --- malformed input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"entity_ids": 5},
        {"entity_ids": True},
        {"entity_ids": []},
        {"entity_ids": [{"a": 1}]},
        {"text": "x", "look_back": 1e20},
        {"text": "x", "look_back": {"days": 1e20}},
        {"text": "x", "look_back": "99999999999:00:00"},
        {"text": "x", "look_back": {"days": 400}},
        {"text": "x", "max_output_tokens": 1e300},
        {"text": ""},
        {"text": "   \n"},
        {"text": "x", "instructions": "i" * 1_000_000},
        {"text": "x", "name": "n" * 101},
        {"text": "x", "requester": "r" * 129},
        {"text": "x", "requester": "two words"},
        {"text": "x", "requester": "line\n"},
        {"text": "x" * 1_000_001},
    ],
)
async def test_summarize_refuses_malformed_input(
    hass: HomeAssistant, manager: JobManager, data: dict[str, Any]
) -> None:
    """Values the issue crashed on, and values past the limits, are schema errors; no job."""
    with pytest.raises(probatio.Invalid):
        await async_call_action(hass, "summarize", **data)
    assert manager.jobs() == []


async def test_summarize_takes_a_number_as_an_entity_id(
    hass: HomeAssistant, manager: JobManager
) -> None:
    """1.5 reads as the entity id "1.5" (Home Assistant's own rule); it is refused later."""
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(hass, "summarize", entity_ids=1.5)
    assert err.value.translation_key == "recorder_not_loaded"
    assert manager.jobs() == []


@pytest.mark.parametrize(
    "data",
    [
        {"prompt": ""},
        {"prompt": "x", "max_tokens": 10**400},
        {"prompt": "x", "model": ""},
        {"prompt": "x", "requester": {"a": "b"}},
        {"prompt": "x", "instructions": "i" * 20_001},
    ],
)
async def test_generate_refuses_malformed_input(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    sim: SimulatedServer,
    data: dict[str, Any],
) -> None:
    """Malformed ``generate`` calls are schema errors; nothing reaches the server."""
    with pytest.raises(probatio.Invalid):
        await async_call_action(
            hass, "generate", config_entry_id=init_integration.entry_id, **data
        )
    assert sim.requests_seen == []


async def test_run_benchmark_refuses_a_huge_duration(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A duration too large to be a float is a schema error, not an OverflowError."""
    with pytest.raises(probatio.Invalid):
        await async_call_action(
            hass,
            "run_benchmark",
            config_entry_id=init_integration.entry_id,
            duration_s=10**400,
        )


# --- what can never fit -------------------------------------------------------------------------


async def test_lanes_are_capped_at_the_servers_context(
    init_integration: MockConfigEntry,
) -> None:
    """Every lane's prompt and output limits stop at what one slot of the server holds."""
    runtime = init_integration.runtime_data
    assert runtime.server.context_per_slot == CONTEXT_PER_SLOT
    for lane in LANES:
        limits = runtime.scheduler.settings.lanes[lane]
        assert limits.max_prompt_tokens == CONTEXT_PER_SLOT
        assert limits.max_output_tokens <= CONTEXT_PER_SLOT
        assert limits.default_output_tokens <= limits.max_output_tokens


async def test_generate_refuses_a_prompt_the_slot_cannot_hold(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """The issue's 4,015-token prompt on 2,048-token slots is refused with the numbers, unsent."""
    entry_id = init_integration.entry_id
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(
            hass, "generate", config_entry_id=entry_id, prompt=_words(4011)
        )
    assert err.value.translation_key == "context_exceeded"
    assert err.value.translation_placeholders == {
        "prompt_tokens": "4015",
        "output_tokens": "512",
        "context": str(CONTEXT_PER_SLOT),
    }
    assert str(CONTEXT_PER_SLOT) in str(err.value)

    # A prompt that fits, with an answer that does not, is refused too.
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(
            hass,
            "generate",
            config_entry_id=entry_id,
            prompt=_words(1800),
            max_tokens=400,
        )
    assert err.value.translation_key == "context_exceeded"
    assert sim.requests_seen == []
    assert init_integration.runtime_data.scheduler.snapshot().requesters == {}

    answer = await async_call_action(
        hass, "generate", config_entry_id=entry_id, prompt=_words(1800), max_tokens=8
    )
    assert answer["output_tokens"] > 0


async def test_generate_refuses_a_prompt_over_its_lane(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """A lane's own limit (lower than the server's context) refuses with the lane's numbers."""
    await async_set_options(hass, init_integration, voice={"max_output_tokens": 64})
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(
            hass,
            "generate",
            config_entry_id=init_integration.entry_id,
            prompt="Lights on",
            lane="voice",
            max_tokens=100,
        )
    assert err.value.translation_key == "limit_exceeded"
    assert err.value.translation_placeholders is not None
    assert err.value.translation_placeholders["maximum"] == "64"
    # The caller's field, not the lane limit's name (max_output_tokens).
    assert err.value.translation_placeholders["limit"] == "max_tokens"
    assert err.value.translation_placeholders["message"].startswith("max_tokens of 100")
    assert sim.requests_seen == []


async def test_summarize_trims_to_what_the_slot_leaves_beside_the_answer(
    hass: HomeAssistant, manager: JobManager
) -> None:
    """A job's prompt fits the slot with its answer: 2,048 less the 512 output tokens.

    (A job's default answer is a quarter of the slot at most: 512 here, not the lane's 1,024.)
    """
    response = await async_call_action(hass, "summarize", text=_words(5000))
    room = CONTEXT_PER_SLOT - manager.limits.default_output_tokens
    assert f"context limit of {room} tokens" in response["prompt_note"]
    [job] = manager.jobs()
    assert job.prompt_tokens_estimate <= room


async def test_summarize_refuses_instructions_that_leave_no_room(
    hass: HomeAssistant, manager: JobManager
) -> None:
    """Instructions that fill the job's prompt are refused with the numbers; nothing stored."""
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(
            hass, "summarize", text="The door opened.", instructions=_words(1500)
        )
    assert err.value.translation_key == "prompt_does_not_fit"
    placeholders = err.value.translation_placeholders
    assert placeholders is not None
    assert placeholders["instructions"] == "1500"
    assert placeholders["maximum"] == str(
        CONTEXT_PER_SLOT - manager.limits.default_output_tokens
    )
    assert manager.jobs() == []


# --- what a REST caller sees ---------------------------------------------------------------------


async def _post(
    client: Any, action: str, data: dict[str, Any]
) -> tuple[HTTPStatus, str]:
    response = await client.post(
        f"/api/services/llm_lanes/{action}?return_response", json=data
    )
    return HTTPStatus(response.status), await response.text()


async def test_rest_callers_tell_refusals_from_failures(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    sim: SimulatedServer,
    hass_client: ClientSessionGenerator,
) -> None:
    """Full queue and spent quota: 400 with the lane and the limit; server down: 500."""
    assert await async_setup_component(hass, "api", {})
    client = await hass_client()
    entry_id = init_integration.entry_id
    call = {"config_entry_id": entry_id, "prompt": "Hi", "max_tokens": 4}

    await async_set_options(hass, init_integration, automation={"max_queued": 0})
    status, body = await _post(client, "generate", call)
    assert status is HTTPStatus.BAD_REQUEST
    assert "automation lane already has 0 requests waiting" in body

    await async_set_options(
        hass,
        init_integration,
        automation={},
        quota_tokens_per_day=1,
        quota_action="reject",
    )
    status, _ = await _post(client, "generate", {**call, "requester": "tablet"})
    assert status is HTTPStatus.OK
    status, body = await _post(client, "generate", {**call, "requester": "tablet"})
    assert status is HTTPStatus.BAD_REQUEST
    assert "tablet used" in body
    assert "tokens allowed per day" in body

    status, body = await _post(client, "generate", {**call, "prompt": ""})
    assert status is HTTPStatus.BAD_REQUEST

    await sim.stop()
    status, body = await _post(client, "generate", call)
    assert status is HTTPStatus.INTERNAL_SERVER_ERROR
    assert "Cannot reach the LLM server" in body
