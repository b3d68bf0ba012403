"""The actions, end to end on a loaded entry against the simulated server.

``generate`` and ``run_benchmark``: answers, validation and errors; ``summarize``, ``list_jobs``
and ``cancel_job``: jobs queued, trimmed, run, listed and cancelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
import threading
from typing import Any
from unittest.mock import patch

from freezegun.api import FrozenDateTimeFactory
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
import probatio
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    MockUser,
    async_capture_events,
)
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.llm_lanes.calibration import EVENT_BENCHMARK_PROGRESS
from custom_components.llm_lanes.const import EVENT_SUMMARY_READY
from custom_components.llm_lanes.core.bench.calibrate import (
    MIN_FINISHED_PER_ROW,
    measured_requests,
    shortest_duration,
)
from custom_components.llm_lanes.core.bench.workload import SCENARIO_DIR, load_scenario
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.jobs.manager import JobManager
from custom_components.llm_lanes.jobs.model import JobStatus
from tools.simulator.server import SimConfig, SimulatedServer

from .support.entities import async_call_entity_action, async_set_options
from .support.entries import async_set_up, server_entry
from .support.requests import async_call_action, finished_requests

CONTEXT_LIMIT = 300


async def _generate(
    hass: HomeAssistant, context: Context | None = None, **data: Any
) -> dict[str, Any]:
    return await async_call_action(hass, "generate", context, **data)


@pytest.fixture
async def entry(init_integration: MockConfigEntry) -> MockConfigEntry:
    """Load the simulated server's entry, with a small background context limit (for jobs)."""
    scheduler = init_integration.runtime_data.scheduler
    scheduler.update_settings(
        scheduler.settings.with_lane(Lane.BACKGROUND, max_prompt_tokens=CONTEXT_LIMIT)
    )
    return init_integration


@pytest.fixture
def manager(entry: MockConfigEntry) -> JobManager:
    """Return the loaded entry's job manager (window 01:00-06:00)."""
    return entry.runtime_data.jobs


# --- generate ---------------------------------------------------------------------------------


async def test_generate_returns_text_tokens_and_timings(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """The answer comes back with token counts and timings, in the automation lane."""
    response = await _generate(
        hass,
        config_entry_id=init_integration.entry_id,
        prompt="What is the weather?",
        instructions="Answer briefly.",
        max_tokens=5,
    )
    assert response["text"]
    assert response["lane"] == "automation"
    assert response["requester"] == "generate"
    assert 0 < response["output_tokens"] <= 5
    assert response["prompt_tokens"] > 0
    assert response["ttft_s"] is not None and response["e2e_s"] >= response["ttft_s"]


async def test_generate_lane_and_requester(
    hass: HomeAssistant, init_integration: MockConfigEntry, hass_admin_user: MockUser
) -> None:
    """The caller picks the lane and the requester; a user call defaults to the user."""
    entry_id = init_integration.entry_id
    response = await _generate(
        hass,
        config_entry_id=entry_id,
        prompt="Hi",
        lane="background",
        requester="kitchen_tablet",
    )
    assert (response["lane"], response["requester"]) == ("background", "kitchen_tablet")
    response = await _generate(
        hass, Context(user_id=hass_admin_user.id), config_entry_id=entry_id, prompt="Hi"
    )
    assert response["requester"] == f"user:{hass_admin_user.id}"


async def test_generate_validation(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Bad input, an unknown server and a broken lane limit are validation errors."""
    entry_id = init_integration.entry_id
    with pytest.raises(probatio.Invalid):
        await _generate(hass, config_entry_id=entry_id, prompt="")
    with pytest.raises(probatio.Invalid):
        await _generate(hass, config_entry_id=entry_id, prompt="x", lane="urgent")
    with pytest.raises(ServiceValidationError) as err:
        await _generate(hass, config_entry_id="nope", prompt="x")
    assert err.value.translation_key == "entry_not_loaded"
    with pytest.raises(ServiceValidationError) as err:
        await _generate(hass, config_entry_id=entry_id, prompt="x", max_tokens=100000)
    assert err.value.translation_key == "limit_exceeded"
    with pytest.raises(ServiceValidationError) as err:
        await _generate(
            hass, config_entry_id=entry_id, prompt="abc " * 9000, lane="voice"
        )
    assert err.value.translation_key == "limit_exceeded"
    assert err.value.translation_placeholders is not None
    assert err.value.translation_placeholders["limit"] == "max_prompt_tokens"


async def test_generate_quota_and_closed(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """Quota past with reject, and a closed scheduler, are translated errors."""
    entry_id = init_integration.entry_id
    await async_set_options(
        hass, init_integration, quota_tokens_per_day=1, quota_action="reject"
    )
    await _generate(hass, config_entry_id=entry_id, prompt="Hi", requester="r")
    with pytest.raises(HomeAssistantError) as err:
        await _generate(hass, config_entry_id=entry_id, prompt="Hi", requester="r")
    assert err.value.translation_key == "quota_exceeded"

    await init_integration.runtime_data.scheduler.close()
    with pytest.raises(HomeAssistantError) as err:
        await _generate(hass, config_entry_id=entry_id, prompt="Hi")
    assert err.value.translation_key == "scheduler_closed"
    assert Lane.AUTOMATION.key == "automation"


# --- run_benchmark ------------------------------------------------------------------------------


@contextmanager
def _scenario_files_read_in_the_loop() -> Iterator[list[str]]:
    """Record the scenario files read (or looked for) in the event loop's thread."""
    loop_thread = threading.get_ident()
    found: list[str] = []

    def spy(name: str) -> Callable[..., Any]:
        original = getattr(Path, name)

        def call(self: Path, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == loop_thread and SCENARIO_DIR in (
                self,
                *self.parents,
            ):
                found.append(f"{name} {self.name}")
            return original(self, *args, **kwargs)

        return call

    with patch.multiple(
        Path, **{name: spy(name) for name in ("exists", "glob", "open", "read_text")}
    ):
        yield found


async def test_run_benchmark_too_short_applies_nothing(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_client: ClientSessionGenerator,
    hass_client_no_auth: ClientSessionGenerator,
) -> None:
    """A one-second calibration returns its table and curve but applies nothing, saying why.

    (It used to apply whatever the first of its identical rows was.) The scenario file is read
    outside the event loop; the curve's chart is served by Home Assistant itself, not from
    ``/local`` (which the test harness does not serve at all, as Home Assistant does not when
    ``www/`` was missing at start): to a logged-in client, and to anyone at the signed URL the
    action returns.
    """
    options = dict(init_integration.options)
    progress = async_capture_events(hass, EVENT_BENCHMARK_PROGRESS)
    with _scenario_files_read_in_the_loop() as read_in_the_loop:
        response = await async_call_action(
            hass,
            "run_benchmark",
            config_entry_id=init_integration.entry_id,
            scenario="voice_vs_background",
            duration_s=1,
            apply=True,
            force=True,
        )
    assert read_in_the_loop == []
    # max sequences 1, 2 (the server's slots) x 2 budgets; the current settings are among them
    assert len(response["rows"]) == 4
    # Said first: how many settings and their longest time (each 1 s, then up to 5 s to
    # finish), again once the batch curve is measured; then each setting done, in the
    # response's order; then the end.
    steps = [
        (
            event.data["step"],
            event.data["settings_done"],
            event.data["settings_total"],
            event.data["remaining_s"],
            event.data["setting"],
        )
        for event in progress
    ]
    assert steps == [
        ("batch_curve", 0, 4, 24, None),
        ("sweep", 0, 4, 24, None),
        *(
            ("setting", done, 4, 6 * (4 - done), row["label"])
            for done, row in enumerate(response["rows"], start=1)
        ),
        ("done", 4, 4, 0, None),
    ]
    assert {event.data["entry_id"] for event in progress} == {init_integration.entry_id}
    elapsed = [event.data["elapsed_s"] for event in progress]
    assert elapsed == sorted(elapsed)
    assert response["current"] == {"max_sequences": "2", "prefill_budget": "4096"}
    assert response["recommended"]
    assert response["verdict"] == "too_short"
    assert "Too short to tell" in response["verdict_reason"]
    assert response["applied"] == {}
    await hass.async_block_till_done()
    assert dict(init_integration.options) == options
    scheduler = init_integration.runtime_data.scheduler
    assert scheduler.settings.max_sequences == 2
    # The curve: in the response, as a chart Home Assistant serves, and as what the scheduler
    # starts its background limit from.
    assert [p["sequences"] for p in response["curve"]["points"]] == [1, 2]
    assert [p.sequences for p in scheduler.batch_cost.points(0.0)] == [1, 2]
    url = response["curve_plot_url"]
    path = url.partition("?")[0]
    assert path == f"/api/llm_lanes/curve/{init_integration.entry_id}.svg"
    for client, target in (
        (await hass_client_no_auth(), url),
        (await hass_client(), path),
    ):
        answer = await client.get(target)
        assert answer.status == 200
        assert answer.content_type == "image/svg+xml"
        assert (await answer.text()).startswith("<svg")
    anonymous = await hass_client_no_auth()
    assert (await anonymous.get(path)).status == 401
    assert (
        await (await hass_client()).get("/api/llm_lanes/curve/nope.svg")
    ).status == 404


async def test_run_benchmark_refuses_a_run_too_short_before_running_it(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim: SimulatedServer
) -> None:
    """The issue's 8 s of *evening*: too few requests per setting to tell settings apart.

    Refused before a request reaches the server, with the duration that would do; that
    duration is not refused.
    """
    seen = len(sim.requests_seen)
    progress = async_capture_events(hass, EVENT_BENCHMARK_PROGRESS)
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(
            hass,
            "run_benchmark",
            config_entry_id=init_integration.entry_id,
            scenario="evening",
            duration_s=8,
            force=True,
        )
    assert err.value.translation_key == "benchmark_too_short"
    placeholders = err.value.translation_placeholders
    assert placeholders is not None
    evening = load_scenario("evening")
    assert placeholders == {
        "scenario": "evening",
        "duration": "8",
        "requests": str(measured_requests(evening, 8)),
        "needed": str(MIN_FINISHED_PER_ROW),
        "shortest": str(shortest_duration(evening)),
    }
    assert int(placeholders["requests"]) < MIN_FINISHED_PER_ROW
    assert len(sim.requests_seen) == seen
    assert progress == []
    assert init_integration.runtime_data.calibration.record is None
    assert measured_requests(evening, int(placeholders["shortest"])) >= (
        MIN_FINISHED_PER_ROW
    )


async def test_run_benchmark_waits_for_the_quiet_hours(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    freezer: FrozenDateTimeFactory,
) -> None:
    """Outside the nightly window the calibration is refused unless forced; nothing changes."""
    await hass.config.async_set_time_zone("UTC")
    freezer.move_to("2026-11-29 14:00:00+00:00")
    options = dict(init_integration.options)
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(
            hass,
            "run_benchmark",
            config_entry_id=init_integration.entry_id,
            apply=True,
        )
    assert err.value.translation_key == "outside_quiet_hours"
    assert err.value.translation_placeholders == {"start": "01:00", "end": "06:00"}
    assert dict(init_integration.options) == options


# --- summarize, list_jobs, cancel_job -------------------------------------------------------------


async def test_summarize_now_and_wait(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """``run_now`` + ``wait`` returns the server's text; the event carries text and tokens."""
    events = async_capture_events(hass, EVENT_SUMMARY_READY)
    finished = finished_requests(entry)

    response = await async_call_action(
        hass,
        "summarize",
        text="The boiler ran for three hours.",
        name="boiler",
        run_now=True,
        wait=True,
        max_output_tokens=12,
    )
    assert response["status"] == "done"
    assert response["text"]
    assert response["output_tokens"] > 0
    assert response["prompt_note"] is None
    await hass.async_block_till_done()
    [event] = events
    assert event.data["job_id"] == response["job_id"]
    assert event.data["text"] == response["text"]
    [request] = finished
    assert request.lane is Lane.BACKGROUND
    assert request.requester == "job:boiler"
    assert request.token_source == "server"
    assert event.data["prompt_tokens"] == request.prompt_tokens


async def test_text_over_the_context_limit_is_trimmed_with_a_note(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    manager: JobManager,
    sim: SimulatedServer,
) -> None:
    """A text far over the lane's context limit is cut, and the prompt, job and event say so."""
    events = async_capture_events(hass, EVENT_SUMMARY_READY)
    finished = finished_requests(entry)
    long_text = "The garage door opened and closed again. " * 400

    response = await async_call_action(
        hass, "summarize", text=long_text, run_now=True, wait=True
    )
    assert response["status"] == "done"
    note = response["prompt_note"]
    assert note is not None and f"context limit of {CONTEXT_LIMIT} tokens" in note
    job = manager.get(response["job_id"])
    assert sim.requests_seen[-1]["messages"][-1]["content"].endswith(f"({note})")
    assert job.prompt_tokens_estimate <= CONTEXT_LIMIT
    assert job.prompt == ""  # a finished job keeps no prompt
    [request] = finished
    assert request.outcome == "ok"
    await hass.async_block_till_done()
    assert events[0].data["prompt_note"] == note


async def test_queued_outside_the_window_then_listed_and_cancelled(
    hass: HomeAssistant, manager: JobManager, freezer: FrozenDateTimeFactory
) -> None:
    """A job outside the window waits (and says why); list and cancel it; a second cancel fails."""
    freezer.move_to("2026-11-29 22:00:00+00:00")
    await hass.config.async_set_time_zone("UTC")
    response = await async_call_action(
        hass, "summarize", text="Lights were left on.", name="lights"
    )
    assert response["status"] == "queued"
    assert response["wait_reason"] == "outside_window"

    listed = await async_call_action(hass, "list_jobs", status="queued")
    [job] = listed["jobs"]
    assert job["job_id"] == response["job_id"]
    assert job["name"] == "lights"
    assert job["config_entry_id"] == manager.entry_id
    assert "prompt" not in job

    cancelled = await async_call_action(hass, "cancel_job", job_id=job["job_id"])
    assert cancelled == {"job_id": job["job_id"], "status": "cancelled"}
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(hass, "cancel_job", job_id=job["job_id"])
    assert err.value.translation_key == "job_already_finished"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"name": "nothing"}, "text_or_entities"),
        ({"text": "x", "notify_target": "notify.nobody"}, "notify_target_not_found"),
        ({"text": "x", "max_output_tokens": 99999}, "max_output_tokens_too_high"),
        ({"text": "x", "config_entry_id": "other"}, "entry_not_loaded"),
    ],
)
async def test_summarize_refuses_bad_calls(
    hass: HomeAssistant, manager: JobManager, data: dict[str, Any], key: str
) -> None:
    """Bad calls fail with a translated validation error and queue nothing."""
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(hass, "summarize", **data)
    assert err.value.translation_key == key
    assert manager.jobs() == []


@pytest.mark.usefixtures("manager")
async def test_unknown_job(hass: HomeAssistant) -> None:
    """Cancelling an unknown job says so."""
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(hass, "cancel_job", job_id="nope")
    assert err.value.translation_key == "job_not_found"


async def test_job_backs_off_while_a_real_voice_stream_is_open(
    hass: HomeAssistant, entry: MockConfigEntry, sim: SimulatedServer
) -> None:
    """A run-now job waits while a voice answer streams, and starts once it is done."""
    scheduler = entry.runtime_data.scheduler
    voice = scheduler.stream(
        ChatRequest(
            model=sim.config.model,
            messages=(ChatMessage(role="user", content="Turn on the lights"),),
            max_tokens=64,
        ),
        lane=Lane.VOICE,
        requester="satellite.kitchen",
    )
    first = await anext(voice)
    assert first.text
    assert scheduler.snapshot().lanes[Lane.VOICE].in_flight == 1

    response = await async_call_action(
        hass, "summarize", text="The oven is on.", run_now=True
    )
    assert response["status"] == "queued"
    assert response["wait_reason"] == "house_busy"

    async for _ in voice:
        pass
    job = await entry.runtime_data.jobs.async_wait(response["job_id"], 60)
    assert job.status is JobStatus.DONE
    assert job.text


async def test_actions_need_one_loaded_server(
    hass: HomeAssistant, init_integration: MockConfigEntry, sim_config: SimConfig
) -> None:
    """Without ``config_entry_id`` the only loaded server is used; with two, say which one.

    ``list_jobs`` and ``cancel_job`` look at every loaded server instead. Jobs are paused, so the
    job stays queued whatever the time of day.
    """
    await async_call_entity_action(
        hass, init_integration, "switch", "jobs_paused", "turn_on"
    )
    queued = await async_call_action(
        hass, "summarize", text="The lights are on.", name="only"
    )
    async with SimulatedServer(sim_config) as second_server:
        second = await async_set_up(
            hass, server_entry(second_server.url, sim_config.kind, title="Second")
        )
        with pytest.raises(ServiceValidationError) as err:
            await async_call_action(hass, "summarize", text="Which server?")
        assert err.value.translation_key == "several_servers"
        listed = await async_call_action(hass, "list_jobs")
        assert [job["job_id"] for job in listed["jobs"]] == [queued["job_id"]]
        cancelled = await async_call_action(hass, "cancel_job", job_id=queued["job_id"])
        assert cancelled["status"] == "cancelled"
        assert await hass.config_entries.async_unload(second.entry_id)

    assert await hass.config_entries.async_unload(init_integration.entry_id)
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(hass, "summarize", text="Anyone?")
    assert err.value.translation_key == "no_server_loaded"


@pytest.mark.usefixtures("manager")
async def test_summarize_entities_needs_the_recorder(hass: HomeAssistant) -> None:
    """Summarizing the history of entities needs the recorder; nothing is queued without it."""
    with pytest.raises(ServiceValidationError) as err:
        await async_call_action(hass, "summarize", entity_ids=["sensor.door"])
    assert err.value.translation_key == "recorder_not_loaded"


async def test_an_unnamed_job_is_charged_to_who_asked(
    hass: HomeAssistant, manager: JobManager, hass_admin_user: MockUser
) -> None:
    """No ``job:<uuid>`` requester: an unnamed job is the caller's, or ``job``; a name is a slug."""
    manager.set_paused(True)
    by_user = await async_call_action(
        hass, "summarize", Context(user_id=hass_admin_user.id), text="Porch light."
    )
    assert by_user["requester"] == f"user:{hass_admin_user.id}"
    by_nobody = await async_call_action(hass, "summarize", text="Porch light.")
    assert by_nobody["requester"] == "job"
    named = await async_call_action(
        hass, "summarize", text="Porch light.", name="Evening digest"
    )
    assert named["requester"] == "job:evening_digest"
