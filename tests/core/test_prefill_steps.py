"""Long background prompts prefilled into their slot in steps, against the simulated llama.cpp."""

from __future__ import annotations

import aiohttp
from aiohttp import web
import pytest

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.backends.detect import connect
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.prefill_steps import DEFAULT_STEP_TOKENS
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.snapshot import GenerateResult
from tools.simulator.server import SimConfig, SimulatedServer

pytestmark = pytest.mark.usefixtures("socket_enabled")

SETTINGS = SchedulerSettings(max_sequences=4, server_slots=4)


def _summary(words: int) -> ChatRequest:
    return ChatRequest(
        model=SimConfig().model,
        messages=(
            ChatMessage(role="system", content="Summarize the log."),
            ChatMessage(role="user", content="door opened " * words),
        ),
        max_tokens=5,
    )


async def _run(
    session: aiohttp.ClientSession,
    requests: list[tuple[ChatRequest, Lane, int]],
    sim_class: type[SimulatedServer] = SimulatedServer,
) -> tuple[SimulatedServer, Backend, Scheduler, list[GenerateResult]]:
    """Send ``(request, lane, prompt tokens)`` one after another through a scheduler."""
    async with sim_class(SimConfig(speed=50)) as sim:
        backend = await connect(session, sim.url)
        scheduler = Scheduler(backend, SETTINGS)
        results = [
            await scheduler.generate(
                request, lane=lane, requester=lane.key, prompt_tokens=tokens
            )
            for request, lane, tokens in requests
        ]
        await scheduler.close()
    return sim, backend, scheduler, results


async def test_long_background_prompt_is_prefilled_in_steps_then_found_cached(
    session: aiohttp.ClientSession,
) -> None:
    """The steps fill the slot's cache; the request itself evaluates only the rest."""
    sim, _, _, (result,) = await _run(session, [(_summary(800), Lane.BACKGROUND, 2500)])
    steps = sim.prefills_seen
    assert len(steps) == -(-2500 // DEFAULT_STEP_TOKENS) - 1
    assert {step["id_slot"] for step in steps} == {sim.requests_seen[0]["id_slot"]}
    lengths = [len(step["prompt"]) for step in steps]
    assert lengths == sorted(lengths)
    usage = result.usage
    assert usage.cached_prompt_tokens is not None
    assert usage.cached_prompt_tokens > 0.8 * usage.prompt_tokens


async def test_steps_learn_the_server_speed(session: aiohttp.ClientSession) -> None:
    """After a few steps the step size follows the speed the server reported."""
    summary = (_summary(800), Lane.BACKGROUND, 2500)
    sim, _, scheduler, _ = await _run(session, [summary, summary])
    step = scheduler._attempts.prefill.pacer.step_tokens(SETTINGS.prefill_step_s)
    # The simulator prefills 256 tokens in 8 ms + 256 x 0.15 ms: about 5,500 tokens/s.
    assert 100 <= step <= 180
    first = -(-2500 // DEFAULT_STEP_TOKENS) - 1
    assert (
        len(sim.prefills_seen) - first >= 2 * first
    )  # the second prompt took smaller steps


async def test_voice_and_short_prompts_go_whole(session: aiohttp.ClientSession) -> None:
    """Only background prompts longer than a step are split."""
    sim, _, _, _ = await _run(
        session,
        [(_summary(800), Lane.VOICE, 2500), (_summary(20), Lane.BACKGROUND, 80)],
    )
    assert sim.prefills_seen == []


class _OldLlamaCpp(SimulatedServer):
    """A llama.cpp without ``/apply-template`` (an older build)."""

    async def _apply_template(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"error": {"code": 404, "message": "Not Found"}}, status=404
        )


async def test_server_without_the_endpoints_gets_whole_prompts(
    session: aiohttp.ClientSession,
) -> None:
    """A 404 turns the steps off for that server; the request is answered all the same."""
    sim, backend, _, (result,) = await _run(
        session, [(_summary(800), Lane.BACKGROUND, 2500)], _OldLlamaCpp
    )
    assert result.finished.outcome == "ok"
    assert not backend.prefills_in_steps
    assert sim.prefills_seen == []
