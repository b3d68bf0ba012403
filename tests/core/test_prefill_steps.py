"""Long background prompts prefilled in steps where the steps pay.

The cost model, and the steps against the simulator's engine on virtual time (and a llama.cpp
without the endpoints).
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
import pytest

from custom_components.llm_lanes.core.backends.base import PrefillStep
from custom_components.llm_lanes.core.backends.detect import connect
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.prefill_steps import PROBE_TOKENS, PrefillCost
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.snapshot import GenerateResult
from tools.simulator.engine import CPU_COSTS, EngineCosts
from tools.simulator.inprocess import EngineBackend, filler
from tools.simulator.server import SimConfig, SimulatedServer

from .boxes import run_virtual

SETTINGS = SchedulerSettings(max_sequences=4, server_slots=4)
STEP_S = SETTINGS.prefill_step_s


def _learned(fixed: float, per_token: float, sizes: tuple[int, ...]) -> PrefillCost:
    cost = PrefillCost()
    for tokens in sizes:
        cost.observe(tokens, fixed + per_token * tokens, tokens * 4)
    return cost


def test_fixed_and_marginal_costs_are_learned_apart() -> None:
    """Two probe sizes tell a step's fixed cost from its cost per token."""
    cost = _learned(0.007, 0.000063, PROBE_TOKENS)
    fit = cost.fit()
    assert fit is not None
    assert fit[0] == pytest.approx(0.007)
    assert fit[1] == pytest.approx(0.000063)


def test_nothing_is_fitted_from_one_size() -> None:
    """Steps of one size cannot tell the fixed cost from the marginal one."""
    assert _learned(0.007, 0.000063, (256, 256, 256)).fit() is None


def test_a_stalled_step_moves_the_fit_little() -> None:
    """One step held up by a host prompt-cache copy does not make every step look slow."""
    cost = _learned(0.001, 0.00003, (128, 384) * 5)
    cost.observe(384, 0.4, 384 * 4)
    fit = cost.fit()
    assert fit is not None
    assert fit[0] < 0.005
    assert fit[1] == pytest.approx(0.00003, rel=0.2)


def test_probe_sizes_then_steps_where_marginal_cost_dominates() -> None:
    """A CPU server (no floor, cheap tasks): long prompts go in steps of about ``prefill_step_s``."""
    cost = PrefillCost()
    assert cost.step_tokens(3000, STEP_S) == PROBE_TOKENS[0]
    cost.observe(PROBE_TOKENS[0], 0.001 + 0.000029 * PROBE_TOKENS[0], 512)
    assert cost.step_tokens(3000, STEP_S) == PROBE_TOKENS[1]
    cost.observe(PROBE_TOKENS[1], 0.001 + 0.000029 * PROBE_TOKENS[1], 1536)
    step = cost.step_tokens(3000, STEP_S)
    assert step is not None
    assert 0.001 + 0.000029 * step == pytest.approx(STEP_S, rel=0.05)
    assert cost.step_tokens(2 * PROBE_TOKENS[0] - 1, STEP_S) is None  # short: whole


@pytest.mark.parametrize(
    ("fixed", "per_token", "prompt"),
    [
        # The H200's pass floor and task overhead: one pass of 1,300 tokens is short.
        (0.020, 0.000063, 1300),
        # A host prompt cache copying a slot at every launch (flash attention off).
        (0.35, 0.000063, 3000),
        (0.35, 0.000063, 20000),
    ],
)
def test_no_steps_where_they_do_not_pay(
    fixed: float, per_token: float, prompt: int
) -> None:
    """Where a step's fixed cost is large, or one pass of the prompt is short, it goes whole."""
    cost = _learned(fixed, per_token, PROBE_TOKENS)
    assert cost.step_tokens(prompt, STEP_S) is None


def test_the_server_batch_bounds_the_wait_for_very_long_prompts() -> None:
    """A prompt longer than the server's batch is evaluated in passes of that batch at most."""
    cost = _learned(0.003, 0.000029, PROBE_TOKENS)
    assert cost.step_tokens(20000, STEP_S) == cost.step_tokens(2048, STEP_S)


def test_server_tokens_per_character_are_learned() -> None:
    """Steps are cut in the server's tokens: its tokenizer and template, not our estimate."""
    cost = PrefillCost()
    cost.observe(200, 0.01, 520)
    cost.observe(400, 0.02, 1040)
    assert cost.chars_per_token() == pytest.approx(2.6)


class _RecordingEngine(EngineBackend):
    """The engine backend, noting whose prompt each prefill step was, in order."""

    def __init__(self, costs: EngineCosts) -> None:
        super().__init__(costs=costs)
        self.steps: list[str] = []

    async def prefill(self, model: str, text: str, slot: int) -> PrefillStep:
        self.steps.append(text.rsplit("|", 2)[-2].rsplit(">", 1)[-1])
        return await super().prefill(model, text, slot)


def _summary(seed: str, tokens: int) -> ChatRequest:
    return ChatRequest(
        model="engine",
        messages=(
            ChatMessage(role="system", content="Summarize the log."),
            ChatMessage(role="user", content=filler(tokens, seed)),
        ),
        max_tokens=5,
        options={"answer_tokens": 5},
    )


def _evening(
    costs: EngineCosts, prompts: list[tuple[str, int]], lane: Lane = Lane.BACKGROUND
) -> tuple[_RecordingEngine, list[GenerateResult]]:
    async def main() -> tuple[_RecordingEngine, list[GenerateResult]]:
        loop = asyncio.get_running_loop()
        backend = _RecordingEngine(costs=costs)
        scheduler = Scheduler(backend, SETTINGS, clock=loop.time)
        results = []
        # Two prompts alone first: the probes, then the costs are known.
        for seed, tokens in prompts[:2]:
            results.append(
                await scheduler.generate(
                    _summary(seed, tokens), lane=lane, requester=seed
                )
            )
        results += await asyncio.gather(
            *(
                scheduler.generate(_summary(seed, tokens), lane=lane, requester=seed)
                for seed, tokens in prompts[2:]
            )
        )
        await scheduler.close()
        await backend.engine.stop()
        return backend, results

    return run_virtual(main)


def test_long_prompts_are_stepped_one_request_at_a_time_on_a_cpu_server() -> None:
    """On the CPU profile the steps pay: every long prompt is stepped, never in lockstep."""
    prompts = [(f"s{i}", 3000) for i in range(5)]
    backend, results = _evening(CPU_COSTS, prompts)
    assert all(result.finished.outcome == "ok" for result in results)
    assert len(backend.steps) > 3 * len(prompts)
    # One request steps at a time: its steps come in one run.
    runs = [
        seed
        for i, seed in enumerate(backend.steps)
        if i == 0 or backend.steps[i - 1] != seed
    ]
    assert sorted(runs) == [seed for seed, _ in prompts]
    # The request itself evaluates one step's worth at most: the rest was cached by the steps.
    step = STEP_S / CPU_COSTS.per_prefill_token_s
    for result in results:
        usage = result.usage
        assert usage.cached_prompt_tokens is not None
        assert usage.prompt_tokens - usage.cached_prompt_tokens <= step


def test_a_server_with_costly_tasks_gets_whole_prompts_after_the_probe() -> None:
    """A task that stalls the server (a host prompt-cache copy) makes steps not pay.

    After the two probe steps, every prompt goes whole.
    """
    stalling = EngineCosts(
        fixed_s=0.35, per_prefill_token_s=0.00006, per_decode_seq_s=0.001
    )
    prompts = [(f"s{i}", 3000) for i in range(4)]
    backend, results = _evening(stalling, prompts)
    assert all(result.finished.outcome == "ok" for result in results)
    assert len(backend.steps) == len(PROBE_TOKENS)


def test_voice_prompts_go_whole() -> None:
    """Only yielding lanes' prompts are stepped."""
    backend, _ = _evening(CPU_COSTS, [("v1", 3000), ("v2", 3000)], lane=Lane.VOICE)
    assert backend.steps == []


class _OldLlamaCpp(SimulatedServer):
    """A llama.cpp without ``/apply-template`` (an older build)."""

    async def _apply_template(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"error": {"code": 404, "message": "Not Found"}}, status=404
        )


@pytest.mark.usefixtures("socket_enabled")
async def test_server_without_the_endpoints_gets_whole_prompts(
    session: aiohttp.ClientSession,
) -> None:
    """A 404 turns the steps off for that server; the request is answered all the same."""
    async with _OldLlamaCpp(SimConfig(speed=50)) as sim:
        backend = await connect(session, sim.url)
        scheduler = Scheduler(backend, SETTINGS)
        result = await scheduler.generate(
            ChatRequest(
                model=SimConfig().model,
                messages=(ChatMessage(role="user", content="door opened " * 800),),
                max_tokens=5,
            ),
            lane=Lane.BACKGROUND,
            requester="digest",
            prompt_tokens=2500,
        )
        await scheduler.close()
    assert result.finished.outcome == "ok"
    assert not backend.prefills_in_steps
    assert sim.prefills_seen == []
