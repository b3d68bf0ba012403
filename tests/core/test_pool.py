"""The pool of a household's servers: routing, failover, wake and sleep, on virtual time.

Two machines (``boxes.py``): a GPU box and a mini PC, each an in-process llama.cpp-like engine
with its own real ``Scheduler``; voice and typed chats prefer the GPU box and fall back on the mini
PC, background work runs on the GPU box only. Every test runs on a virtual-time loop, so minutes
of waking and idling cost nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
import contextlib
from dataclasses import dataclass, field, replace
import random

import pytest

from custom_components.llm_lanes.core.availability import PowerControl, ServerState
from custom_components.llm_lanes.core.errors import (
    BackendConnectionError,
    LimitExceededError,
    NoServerError,
    QuotaExceededError,
    SchedulerClosedError,
    WakeTimeoutError,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, StreamChunk, ToolSpec
from custom_components.llm_lanes.core.pool import ServerPool
from custom_components.llm_lanes.core.pool_members import PoolMember, PoolSettings
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.router import Capabilities
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import QuotaAction, SchedulerSettings
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from tools.simulator.engine import EngineCosts

from .boxes import GPU_COSTS, MINI_PC_COSTS, Box, now, request, run_virtual, words

ROUTES: Mapping[Lane, tuple[str, ...]] = {
    Lane.VOICE: ("gpu", "mini"),
    Lane.INTERACTIVE: ("gpu", "mini"),
    Lane.AUTOMATION: ("gpu", "mini"),
    Lane.BACKGROUND: ("gpu",),
}


@dataclass
class Household:
    """The pool of a GPU box and a mini PC, and what the tests read of it."""

    gpu: Box
    mini: Box
    pool: ServerPool
    schedulers: dict[str, Scheduler]
    finished: list[FinishedRequest] = field(default_factory=list)
    attempts: dict[str, list[FinishedRequest]] = field(default_factory=dict)
    """Every record each member scheduler reported (attempts)."""
    sleeps: list[float] = field(default_factory=list)
    wakes: list[float] = field(default_factory=list)

    async def answer(
        self,
        text: str = "turn on the light",
        *,
        lane: Lane = Lane.VOICE,
        answer_tokens: int = 8,
        requester: str = "user:anna",
        server: str | None = None,
    ) -> str:
        """Stream one request through the pool; return its text."""
        chat = request(text, answer_tokens=answer_tokens)
        stream = self.pool.stream(chat, lane=lane, requester=requester, server=server)
        return "".join([chunk.text async for chunk in stream])

    def assert_idle(self) -> None:
        """No request waits or runs anywhere: every slot was given back."""
        for name, scheduler in self.schedulers.items():
            snapshot = scheduler.snapshot()
            assert (snapshot.queue_depth, snapshot.in_flight) == (0, 0), name
            table = scheduler._slots.table
            assert table is None or table.holder_count() == 0, name
        for box in (self.gpu, self.mini):
            assert box.server.in_flight == {}, box.name
            assert not box.server.engine.running, box.name


async def household(
    *,
    gpu_powered: bool = True,
    gpu_state: ServerState = ServerState.UP,
    gpu_power: PowerControl | None = None,
    routes: Mapping[Lane, tuple[str, ...]] = ROUTES,
    settings: SchedulerSettings | None = None,
    gpu_capabilities: Capabilities | None = None,
    mini_capabilities: Capabilities | None = None,
    pool_settings: dict[str, float] | None = None,
    boot_s: float = 20.0,
    mini_costs: EngineCosts = MINI_PC_COSTS,
    mini_prefill_tok_s: float = 500.0,
) -> Household:
    """Build the household's pool on the running (virtual-time) loop."""
    clock = asyncio.get_running_loop().time
    gpu = Box("gpu", powered=gpu_powered)
    mini = Box("mini", costs=mini_costs)
    settings = settings or SchedulerSettings(max_sequences=4, server_slots=4)
    quotas = QuotaLedger()
    schedulers = {
        box.name: Scheduler(box, settings, clock=clock, quotas=quotas)
        for box in (gpu, mini)
    }
    sleeps: list[float] = []
    wakes: list[float] = []

    async def wake() -> None:
        wakes.append(clock())
        gpu.boot(boot_s)

    async def sleep() -> None:
        sleeps.append(clock())
        gpu.kill()

    if gpu_power is None:
        gpu_power = PowerControl(wake=wake, sleep=sleep, wake_limit_s=120.0)
    else:
        gpu_power = PowerControl(
            wake=wake if gpu_power.wake is not None else None,
            sleep=sleep if gpu_power.sleep is not None else None,
            wake_limit_s=gpu_power.wake_limit_s,
            idle_sleep_s=gpu_power.idle_sleep_s,
        )

    def member(
        box: Box, capabilities: Capabilities, prefill_tok_s: float
    ) -> PoolMember:
        return PoolMember(
            name=box.name,
            scheduler=schedulers[box.name],
            health=box.health,
            capabilities=capabilities,
            prefill_tok_s=prefill_tok_s,
        )

    pool = ServerPool(
        [
            replace(
                member(gpu, gpu_capabilities or Capabilities(model="qwen3:8b"), 6000.0),
                power=gpu_power,
                state=gpu_state,
            ),
            member(
                mini,
                mini_capabilities or Capabilities(model="qwen3:1.7b"),
                mini_prefill_tok_s,
            ),
        ],
        PoolSettings(routes=routes, **(pool_settings or {})),
        quotas=quotas,
        clock=clock,
    )
    home = Household(gpu, mini, pool, schedulers, sleeps=sleeps, wakes=wakes)
    pool.add_listener(home.finished.append)
    for name, scheduler in schedulers.items():
        scheduler.add_listener(home.attempts.setdefault(name, []).append)
    return home


# --- placement --------------------------------------------------------------------------------------


def test_voice_goes_to_the_preferred_faster_box_with_its_own_model() -> None:
    """Both up: a command goes to the GPU box, run as that box's model; the record names it."""

    async def main() -> None:
        home = await household()
        text = await home.answer()
        assert text == words(0, 8)
        (record,) = home.finished
        assert (record.server, record.failovers, record.resumed_on) == ("gpu", 0, None)
        assert record.path == ("gpu",)
        assert record.outcome == "ok" and record.output_tokens == 8
        assert [r.model for r in home.gpu.requests] == ["qwen3:8b"]
        assert home.mini.requests == []
        snapshot = home.pool.snapshot()
        assert snapshot.members["gpu"].served_total == 1
        assert snapshot.preferred[Lane.VOICE] == "gpu"
        assert snapshot.requests_total == 1 and snapshot.in_flight == 0
        home.assert_idle()

    run_virtual(main)


def test_a_busy_preferred_box_passes_voice_to_an_idle_one() -> None:
    """A busy preferred box passes voice to an idle one.

    Two boxes alike: commands go to the preferred one while it is free; while its only slot
    holds a long chat, a command goes to the other one rather than wait.
    """

    async def main() -> None:
        home = await household(
            settings=SchedulerSettings(max_sequences=1, server_slots=1, headroom=0),
            mini_costs=GPU_COSTS,
            mini_prefill_tok_s=6000.0,
        )
        await home.answer("a first command")
        assert home.finished[-1].server == "gpu"
        story = asyncio.create_task(
            home.answer("read me a story", lane=Lane.INTERACTIVE, answer_tokens=400)
        )
        await asyncio.sleep(0.5)
        assert await home.answer("a command") == words(0, 8)
        assert home.finished[-1].server == "mini"
        await story
        assert home.finished[-1].server == "gpu"
        home.assert_idle()

    run_virtual(main)


def test_requests_a_box_cannot_serve_go_to_one_that_can() -> None:
    """Tools only on the mini PC, a model only the GPU box serves: each goes where it can run."""

    async def main() -> None:
        home = await household(
            gpu_capabilities=Capabilities(
                model="qwen3:8b", models=("qwen3:8b",), tools=False
            ),
            mini_capabilities=Capabilities(model="qwen3:1.7b", models=("qwen3:1.7b",)),
        )
        tool = ToolSpec(name="HassTurnOn", description="turn on", parameters={})
        chat = request(tools=(tool,))
        async for _ in home.pool.stream(chat, lane=Lane.VOICE, requester="u"):
            pass
        assert home.finished[-1].server == "mini"
        named = request(model="qwen3:1.7b")
        result = await home.pool.generate(named, lane=Lane.VOICE, requester="u")
        assert result.finished.server == "mini"
        assert home.mini.requests[-1].model == "qwen3:1.7b"
        with pytest.raises(NoServerError, match="does not serve the model llama3"):
            await home.pool.generate(
                request(model="llama3"), lane=Lane.VOICE, requester="u"
            )
        assert home.finished[-1].outcome == "error"
        home.assert_idle()

    run_virtual(main)


def test_a_request_over_every_lane_limit_gets_the_lanes_own_error() -> None:
    """A prompt no server's lane takes is refused with the limit it breaks, nothing sent."""

    async def main() -> None:
        home = await household()
        huge = request("x" * 40_000, system=None)
        with pytest.raises(LimitExceededError, match="max_prompt_tokens"):
            await home.pool.generate(huge, lane=Lane.VOICE, requester="u")
        assert home.gpu.requests == [] and home.mini.requests == []
        assert home.finished[-1].outcome == "rejected"

    run_virtual(main)


# --- failover -------------------------------------------------------------------------------------


def test_a_box_that_fails_before_the_first_token_passes_the_command_on() -> None:
    """A box that fails before the first token passes the command on.

    The GPU box refuses the connection: the mini PC answers, the GPU box is down until it
    answers its health check again, and then commands return to it.
    """

    async def main() -> None:
        home = await household()
        home.gpu.kill()
        assert await home.answer() == words(0, 8)
        record = home.finished[-1]
        assert (record.server, record.failovers, record.resumed_on) == ("mini", 1, None)
        assert record.path == ("gpu", "mini")  # the servers its attempts went to
        assert record.outcome == "ok"
        assert home.pool.state("gpu") is ServerState.DOWN
        # While it is down nothing is sent to it.
        sent = len(home.gpu.requests)
        await home.answer()
        assert home.finished[-1].server == "mini"
        assert home.finished[-1].failovers == 0
        assert len(home.gpu.requests) == sent
        home.gpu.boot()
        await asyncio.sleep(4.0)
        assert home.pool.state("gpu") is ServerState.UP
        await home.answer()
        assert home.finished[-1].server == "gpu"
        snapshot = home.pool.snapshot()
        assert snapshot.members["gpu"].failures_total == 1
        assert snapshot.failovers_total == 1
        home.assert_idle()

    run_virtual(main)


def test_a_box_that_dies_mid_answer_is_continued_seamlessly_on_the_other() -> None:
    """A box that dies mid-answer is continued seamlessly on the other.

    Killed after some tokens, the answer resumes on the mini PC from the partial output: the
    caller reads one stream with every token once, and the record says where it resumed.
    """

    async def main() -> None:
        home = await household()
        chunks: list[StreamChunk] = []
        chat = request("tell me about the house", answer_tokens=40)
        async for chunk in home.pool.stream(
            chat, lane=Lane.INTERACTIVE, requester="user:anna"
        ):
            chunks.append(chunk)
            if len(chunks) == 10:
                home.gpu.kill()
        assert "".join(c.text for c in chunks) == words(0, 40)
        final = chunks[-1]
        assert final.done and final.finish_reason == "stop"
        assert final.usage is not None and final.usage.output_tokens == 40
        (record,) = home.finished
        assert (record.server, record.failovers, record.resumed_on) == (
            "mini",
            1,
            "mini",
        )
        assert record.outcome == "ok" and record.output_tokens == 40
        resumed = home.mini.requests[-1]
        assert resumed.assistant_prefix == words(0, 10)
        # The output left of the lane's default limit (the caller set none).
        assert (
            resumed.max_tokens == Lane.INTERACTIVE.defaults.default_output_tokens - 10
        )
        assert resumed.model == "qwen3:1.7b"
        # Each attempt is its own server's record; only one of them ended well.
        assert [r.outcome for r in home.attempts["gpu"]] == ["error"]
        assert [r.outcome for r in home.attempts["mini"]] == ["ok"]
        assert home.pool.snapshot().members["mini"].resumed_total == 1
        home.assert_idle()

    run_virtual(main)


def test_a_box_that_hangs_holds_a_voice_command_only_for_the_stall_limit() -> None:
    """The GPU box accepts and never answers: after ``urgent_stall_s`` the command goes on."""

    async def main() -> None:
        home = await household(pool_settings={"urgent_stall_s": 2.0})
        home.gpu.hangs = True
        assert await home.answer() == words(0, 8)
        record = home.finished[-1]
        assert record.server == "mini" and record.failovers == 1
        (abandoned,) = home.attempts["gpu"]
        assert abandoned.outcome == "cancelled"
        assert (
            2.0 <= abandoned.e2e_s < 2.5
        )  # the stall limit past the expected first token
        assert record.queue_wait_s == pytest.approx(abandoned.e2e_s, abs=0.05)
        home.gpu.hangs = False
        home.assert_idle()

    run_virtual(main)


def test_a_caller_that_stops_reading_frees_the_slot_and_ends_the_request_once() -> None:
    """Closing the pool's stream mid-answer cancels it at its server: one record, no slot held."""

    async def main() -> None:
        home = await household()
        stream = home.pool.stream(
            request(answer_tokens=100), lane=Lane.INTERACTIVE, requester="u"
        )
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                if chunk.output_tokens and len(home.gpu.server.served) >= 3:
                    break
        await asyncio.sleep(0.1)
        (record,) = home.finished
        assert (record.outcome, record.server) == ("cancelled", "gpu")
        assert [r.outcome for r in home.attempts["gpu"]] == ["cancelled"]
        home.assert_idle()

    run_virtual(main)


def test_a_closed_pool_refuses_new_requests() -> None:
    """After ``close`` a request fails at once with the scheduler-closed error."""

    async def main() -> None:
        home = await household()
        await home.pool.close()
        with pytest.raises(SchedulerClosedError):
            await home.answer()
        assert home.finished[-1].error == "SchedulerClosedError"
        assert home.gpu.requests == []

    run_virtual(main)


def test_a_request_for_one_server_does_not_move() -> None:
    """``server="gpu"`` runs there or fails with the server's own error."""

    async def main() -> None:
        home = await household()
        home.gpu.kill()
        with pytest.raises(BackendConnectionError):
            await home.answer(server="gpu")
        assert home.mini.requests == []
        assert (
            home.finished[-1].server == "gpu" and home.finished[-1].outcome == "error"
        )
        home.assert_idle()

    run_virtual(main)


def test_every_server_failing_ends_the_request_with_the_last_error() -> None:
    """Both boxes refuse: the caller gets the servers' error, fast, and both are down."""

    async def main() -> None:
        home = await household()
        home.gpu.kill()
        home.mini.kill()
        started = now()
        with pytest.raises(BackendConnectionError):
            await home.answer()
        assert now() - started < 0.1
        with pytest.raises(NoServerError, match="down or asleep"):
            await home.answer()
        home.assert_idle()

    run_virtual(main)


# --- voice, sleep and wake ---------------------------------------------------------------------------


def test_voice_never_waits_for_a_sleeping_box() -> None:
    """Voice never waits for a sleeping box.

    The GPU box sleeps: a command is answered by the mini PC at once, the GPU box not woken;
    with every voice server asleep or down a command fails at once.
    """

    async def main() -> None:
        home = await household(gpu_powered=False, gpu_state=ServerState.ASLEEP)
        assert await home.answer() == words(0, 8)
        record = home.finished[-1]
        assert record.server == "mini" and record.failovers == 0
        assert record.queue_wait_s < 0.01
        assert home.wakes == [] and home.pool.state("gpu") is ServerState.ASLEEP
        home.pool.report("mini", ServerState.DOWN)
        started = now()
        with pytest.raises(NoServerError, match="voice"):
            await home.answer()
        assert now() - started < 0.01
        assert home.wakes == []

    run_virtual(main)


def test_a_job_wakes_the_sleeping_box_waits_and_runs_while_voice_goes_to_the_mini_pc() -> (
    None
):
    """A job wakes the sleeping box, waits and runs there; voice goes to the mini PC meanwhile.

    Background work only the GPU box may serve wakes it, waits for its health check and runs
    there; a command during the wait is answered by the mini PC without waiting.
    """

    async def main() -> None:
        home = await household(gpu_powered=False, gpu_state=ServerState.ASLEEP)
        started = now()
        job = asyncio.create_task(
            home.answer("summarize the day", lane=Lane.BACKGROUND, answer_tokens=20)
        )
        await asyncio.sleep(1.0)
        assert home.pool.state("gpu") is ServerState.WAKING
        assert len(home.wakes) == 1
        voice_started = now()
        assert await home.answer("what time is it") == words(0, 8)
        voice = home.finished[-1]
        assert voice.server == "mini" and now() - voice_started < 5.0
        assert await job == words(0, 20)
        record = home.finished[-1]
        assert record.server == "gpu" and record.lane is Lane.BACKGROUND
        assert now() - started >= 20.0
        assert home.pool.state("gpu") is ServerState.UP
        assert len(home.wakes) == 1  # one wake for everything that waited
        home.assert_idle()

    run_virtual(main)


def test_a_box_that_looks_down_is_woken_for_a_job_only_it_may_serve() -> None:
    """A sleeping desktop often looks like a server that is down: with a wake action, it is woken.

    The GPU box is reported down (its probe finds nothing); a job for it presses its wake action
    and runs once it answers; the probe and the wake do not fight over its state.
    """

    async def main() -> None:
        home = await household(gpu_powered=False)
        home.pool.report("gpu", ServerState.DOWN)
        await asyncio.sleep(10.0)
        assert home.pool.state("gpu") is ServerState.DOWN and home.wakes == []
        assert await home.answer(lane=Lane.BACKGROUND) == words(0, 8)
        assert home.finished[-1].server == "gpu" and len(home.wakes) == 1
        assert home.pool.state("gpu") is ServerState.UP
        home.assert_idle()

    run_virtual(main)


def test_a_box_that_does_not_wake_within_its_limit_fails_the_job_clearly() -> None:
    """The wake action runs but the box never answers: after the limit, a clear error."""

    async def main() -> None:
        home = await household(
            gpu_powered=False,
            gpu_state=ServerState.ASLEEP,
            gpu_power=PowerControl(wake=_unused, wake_limit_s=60.0),
            boot_s=10_000.0,
        )
        started = now()
        with pytest.raises(WakeTimeoutError, match="gpu did not wake within 60 s"):
            await home.answer(lane=Lane.BACKGROUND)
        assert 60.0 <= now() - started < 70.0
        assert home.pool.state("gpu") is ServerState.ASLEEP
        assert home.finished[-1].outcome == "error"
        assert home.finished[-1].error == "WakeTimeoutError"

    run_virtual(main)


def test_an_idle_box_is_put_to_sleep_after_its_idle_time() -> None:
    """An idle box is put to sleep after its idle time.

    After its work and ``idle_sleep_s`` idle seconds the GPU box is put to sleep; work in
    between starts the idle time again.
    """

    async def main() -> None:
        home = await household(
            gpu_power=PowerControl(
                wake=_unused, sleep=_unused, wake_limit_s=120.0, idle_sleep_s=600.0
            )
        )
        await home.answer()
        done = now()
        await asyncio.sleep(400.0)
        assert home.sleeps == []
        await home.answer()
        second = now()
        await asyncio.sleep(500.0)
        assert home.sleeps == [] and home.pool.state("gpu") is ServerState.UP
        await asyncio.sleep(200.0)
        assert len(home.sleeps) == 1
        assert home.sleeps[0] - second == pytest.approx(600.0, abs=1.0)
        assert home.sleeps[0] - done > 600.0
        assert home.pool.state("gpu") is ServerState.ASLEEP
        assert not home.gpu.powered
        # Voice now goes to the mini PC; background wakes the GPU box again.
        await home.answer()
        assert home.finished[-1].server == "mini"
        await home.answer(lane=Lane.BACKGROUND)
        assert home.finished[-1].server == "gpu" and len(home.wakes) == 1
        home.assert_idle()

    run_virtual(main)


def test_prepare_wakes_the_big_box_for_the_follow_up() -> None:
    """An announced command wakes the big box for the follow-up.

    The GPU box sleeps: it starts waking; this command goes to the mini PC, the follow-up to
    the GPU box once it is up.
    """

    async def main() -> None:
        home = await household(gpu_powered=False, gpu_state=ServerState.ASLEEP)
        home.pool.prepare()
        await asyncio.sleep(0)
        assert home.pool.state("gpu") is ServerState.WAKING
        # The mini PC, where the command will go, makes room for it meanwhile.
        assert home.schedulers["mini"]._foreground.announced_until > now()
        await home.answer("turn on the light")
        assert home.finished[-1].server == "mini"
        await asyncio.sleep(30.0)
        assert home.pool.state("gpu") is ServerState.UP
        await home.answer("and the kitchen too")
        assert home.finished[-1].server == "gpu"
        home.assert_idle()

    run_virtual(main)


# --- the household's ledger ---------------------------------------------------------------------------


def test_a_requester_s_quota_counts_every_server() -> None:
    """Tokens used on the GPU box count against the quota on the mini PC: one ledger."""

    async def main() -> None:
        settings = SchedulerSettings(
            max_sequences=4,
            server_slots=4,
            quota_action=QuotaAction.REJECT,
            requester_quotas={"user:kid": 2_000},
        )
        home = await household(settings=settings)
        await home.answer(requester="user:kid", server="gpu")
        used = home.pool.quotas.used("user:kid", now())
        assert used > 2_000
        with pytest.raises(QuotaExceededError):
            await home.answer(requester="user:kid", server="mini")
        with pytest.raises(QuotaExceededError):
            await home.answer(requester="user:kid")
        assert home.finished[-1].outcome == "rejected"
        assert home.mini.requests == []
        snapshot = home.pool.snapshot()
        for member in snapshot.members.values():
            assert member.scheduler.requesters["user:kid"].tokens_last_24h == used

    run_virtual(main)


# --- a whole evening ---------------------------------------------------------------------------------


def test_an_evening_with_the_gpu_box_killed_and_restarted_loses_no_request() -> None:
    """An evening with the GPU box killed and restarted loses no request.

    Voice, chats, automations and jobs while the GPU box is killed mid-run and restarted:
    every request ends once, well, with its whole answer in one stream, on one server; no slot
    is left held anywhere; after the restart routing returns to the GPU box. (Jobs may use the
    mini PC here: a lane whose every server fails ends with the servers' error.)
    """

    async def main() -> None:
        # The headroom grown for the long Assist prompt keeps this evening's summaries on the
        # GPU box when it is killed (the failover of both lanes is what is checked).
        home = await household(
            routes={**ROUTES, Lane.BACKGROUND: ("gpu", "mini")},
            settings=SchedulerSettings(
                max_sequences=4, server_slots=4, learn_headroom=True
            ),
        )
        rng = random.Random(20)
        lanes = (Lane.VOICE, Lane.INTERACTIVE, Lane.AUTOMATION, Lane.BACKGROUND)
        answers: dict[int, tuple[int, str]] = {}

        async def one(index: int, lane: Lane, tokens: int, delay: float) -> None:
            await asyncio.sleep(delay)
            chat = request(f"request {index}", answer_tokens=tokens)
            if lane is Lane.INTERACTIVE:
                chat = request(
                    f"and then {index}",
                    answer_tokens=tokens,
                    history=(
                        ChatMessage(role="user", content=f"chat {index % 3}"),
                        ChatMessage(role="assistant", content="sure"),
                    ),
                )
            parts = [
                chunk.text
                async for chunk in home.pool.stream(
                    chat, lane=lane, requester=f"user:{index % 4}"
                )
            ]
            answers[index] = (tokens, "".join(parts))

        async def outage() -> None:
            await asyncio.sleep(6.0)
            home.gpu.kill()
            await asyncio.sleep(10.0)
            home.gpu.boot()

        jobs = [
            one(
                index,
                lane := rng.choice(lanes),
                rng.randint(50, 150) if lane is Lane.BACKGROUND else rng.randint(5, 40),
                rng.uniform(0.0, 30.0),
            )
            for index in range(60)
        ]
        await asyncio.gather(outage(), *jobs)
        assert len(answers) == 60
        for index, (tokens, text) in answers.items():
            assert text == words(0, tokens), index
        assert len(home.finished) == 60
        assert all(record.outcome == "ok" for record in home.finished)
        assert len({record.request_id for record in home.finished}) == 60
        ok_attempts = sum(
            record.outcome == "ok"
            for records in home.attempts.values()
            for record in records
        )
        assert ok_attempts == 60  # each request ended well on exactly one server
        moved = [record for record in home.finished if record.failovers]
        assert any(record.resumed_on == "mini" for record in moved)  # mid-answer
        assert any(
            record.resumed_on is None for record in moved
        )  # before the first token
        assert {record.lane for record in moved} >= {Lane.VOICE, Lane.BACKGROUND}
        home.assert_idle()
        # After the restart (and the probe), commands go to the GPU box again.
        await asyncio.sleep(5.0)
        await home.answer()
        assert home.finished[-1].server == "gpu"

    run_virtual(main)


async def _unused() -> None:
    """Stand for a power action the test replaces with its own (see ``household``)."""


# --- members that come and go ---------------------------------------------------------------------


def test_a_member_s_attempts_are_told_apart_from_its_own_requests() -> None:
    """A member scheduler's record is an attempt of the pool while the pool routes it, not else.

    The household's event reports each pool request once: it leaves the attempts out.
    """

    async def main() -> None:
        home = await household()
        seen: list[tuple[str, bool]] = []
        home.schedulers["gpu"].add_listener(
            lambda record: seen.append((record.outcome, home.pool.is_attempt(record)))
        )
        await home.answer()
        stream = home.schedulers["gpu"].stream(
            request(), lane=Lane.VOICE, requester="user:anna"
        )
        assert [chunk async for chunk in stream][-1].done
        assert seen == [("ok", True), ("ok", False)]
        home.assert_idle()

    run_virtual(main)


def test_members_that_leave_and_come_back_keep_what_the_pool_knew() -> None:
    """The mini PC leaves (its scheduler closes): voice goes to the GPU box, the record once.

    A request on the mini PC when it leaves fails over to the GPU box; a member that stays keeps
    its counters and takes its new power control; the mini PC set up again starts afresh.
    """

    async def main() -> None:
        home = await household(
            settings=SchedulerSettings(max_sequences=1, server_slots=1, headroom=0),
            mini_costs=GPU_COSTS,
            mini_prefill_tok_s=6000.0,
        )
        gpu_config, mini_config = _configs(home)
        story = asyncio.create_task(
            home.answer("a long story", lane=Lane.INTERACTIVE, answer_tokens=300)
        )
        await asyncio.sleep(0.2)
        text = asyncio.create_task(
            home.answer("a chat", lane=Lane.INTERACTIVE, answer_tokens=200)
        )
        await asyncio.sleep(0.5)
        assert home.schedulers["mini"].snapshot().in_flight == 1
        sleep_power = PowerControl(wake=_unused, sleep=_unused, idle_sleep_s=60.0)
        await home.pool.update(
            [replace(gpu_config, power=sleep_power)],
            PoolSettings(routes={Lane.VOICE: ("gpu",)}),
        )
        await home.schedulers["mini"].close()
        assert await text == words(0, 200)
        assert await story == words(0, 300)
        chat = next(r for r in home.finished if r.output_tokens == 200)
        assert (chat.server, chat.failovers, chat.resumed_on) == ("gpu", 1, "gpu")
        assert home.pool.route(Lane.BACKGROUND) == ("gpu",)
        assert home.pool.snapshot().members["gpu"].served_total == 2
        await asyncio.sleep(61.0)
        assert home.pool.state("gpu") is ServerState.ASLEEP  # its new idle time

        again = Scheduler(
            home.mini,
            home.schedulers["gpu"].settings,
            clock=now,
            quotas=home.pool.quotas,
        )
        await home.pool.update(
            [
                replace(gpu_config, power=sleep_power),
                replace(mini_config, scheduler=again),
            ],
            PoolSettings(routes=ROUTES),
        )
        assert home.pool.snapshot().members["mini"].served_total == 0
        await home.answer()
        assert home.finished[-1].server == "mini"
        with pytest.raises(ValueError, match="unknown servers: attic"):
            await home.pool.update(
                [gpu_config], PoolSettings(routes={Lane.VOICE: ("attic",)})
            )
        assert home.pool.route(Lane.VOICE) == ("gpu", "mini")

    run_virtual(main)


def test_work_waiting_inside_a_shared_server_sends_requests_elsewhere() -> None:
    """A server whose own metrics say work waits inside it loses voice to an idle one."""

    async def main() -> None:
        home = await household(mini_costs=GPU_COSTS, mini_prefill_tok_s=6000.0)
        await home.answer()
        assert home.finished[-1].server == "gpu"
        home.pool.report_queue("gpu", 40)
        await home.answer("another command")
        assert home.finished[-1].server == "mini"
        home.pool.report_queue("gpu", 0)
        await home.answer("and a third")
        assert home.finished[-1].server == "gpu"

    run_virtual(main)


def _configs(home: Household) -> tuple[PoolMember, PoolMember]:
    """Return the members' configurations as ``household`` built them."""
    members = home.pool._members
    return members["gpu"].config, members["mini"].config
