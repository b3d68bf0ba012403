"""The router: what a request would feel at each server, and where it goes.

Servers are real schedulers in front of the in-process engine (``boxes.py``) on virtual time; the
router reads them through ``Scheduler.load``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    TokenUsage,
    ToolSpec,
)
from custom_components.llm_lanes.core.router import (
    ANY_MODEL,
    Candidate,
    Capabilities,
    Estimate,
    Observed,
    RecentPrefixes,
    Router,
)
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from tools.bench import micro

from .boxes import MINI_PC_COSTS, Box, now, request, run_virtual

SETTINGS = SchedulerSettings(max_sequences=4, server_slots=4)


def scheduler(box: Box, settings: SchedulerSettings = SETTINGS) -> Scheduler:
    """Return a real scheduler in front of ``box`` on the loop's clock."""
    return Scheduler(box, settings, clock=asyncio.get_running_loop().time)


def candidate(
    name: str, sched: Scheduler, *, prefill_tok_s: float = 500.0
) -> Candidate:
    """Return the server as the router weighs it."""
    return Candidate(name=name, load=sched.load, observed=Observed(prefill_tok_s))


async def run_once(
    sched: Scheduler, chat: ChatRequest, lane: Lane = Lane.VOICE
) -> None:
    """Send one request straight to a server's scheduler, to the end."""
    await sched.generate(chat, lane=lane, requester="user:anna")


def test_a_warm_assist_prompt_beats_a_cold_prefill_of_seconds() -> None:
    """A warm Assist prompt beats a cold prefill of seconds.

    Two mini PCs: the one whose slot holds the Assist prompt saves its 2,000-token prefill
    (four seconds at 500 tokens/s) and wins over the preferred cold one; a prompt neither
    holds goes to the preferred one.
    """

    async def main() -> None:
        cold, warm = Box("cold", costs=MINI_PC_COSTS), Box("warm", costs=MINI_PC_COSTS)
        cold_s, warm_s = scheduler(cold), scheduler(warm)
        await run_once(warm_s, request("turn on the light"))
        router = Router()
        chat = request("turn off the light")
        shape = router.shape(chat)
        servers = [candidate("cold", cold_s), candidate("warm", warm_s)]
        chosen = router.choose(servers, shape, Lane.VOICE, 256, now())
        assert chosen.server == "warm"
        assert chosen.cached_tokens == shape.stable_tokens >= 2000
        cold_estimate = router.estimate(servers[0], shape, Lane.VOICE, 256, now())
        assert cold_estimate.cached_tokens == 0
        assert cold_estimate.ttft_s == pytest.approx(shape.tokens / 500.0, rel=0.01)
        assert chosen.ttft_s < 0.1
        assert cold_estimate.ttft_s > 3.0
        other = request("what is the weather", system="You are a weather bot.")
        assert (
            router.choose(servers, router.shape(other), Lane.VOICE, 256, now()).server
            == "cold"
        )

    run_virtual(main)


def test_within_the_objectives_the_preferred_server_wins() -> None:
    """Within the objectives the preferred server wins.

    A GPU box prefills the Assist prompt in a third of a second, within voice's objective: it
    keeps the command although the other box holds the prompt warm.
    """

    async def main() -> None:
        gpu, other = Box("gpu"), Box("other")
        gpu_s, other_s = scheduler(gpu), scheduler(other)
        await run_once(other_s, request())
        router = Router()
        shape = router.shape(request("dim the lights"))
        servers = [
            candidate("gpu", gpu_s, prefill_tok_s=6000.0),
            candidate("other", other_s, prefill_tok_s=6000.0),
        ]
        chosen = router.choose(servers, shape, Lane.VOICE, 256, now())
        assert chosen.server == "gpu"
        assert 0.3 < chosen.ttft_s < Lane.VOICE.defaults.ttft_slo_s
        assert chosen.felt_s == Lane.VOICE.defaults.ttft_slo_s

    run_virtual(main)


def test_a_queue_ahead_is_a_wait_and_sends_the_command_elsewhere() -> None:
    """A queue ahead is a wait, and sends the command elsewhere.

    Two commands already wait for the GPU box's only slot: the next one's wait is three slot
    holds (theirs and the running one's), so it goes to the other box.
    """

    async def main() -> None:
        settings = SchedulerSettings(max_sequences=1, server_slots=1, headroom=0)
        gpu, other = Box("gpu"), Box("other")
        gpu_s, other_s = scheduler(gpu, settings), scheduler(other, settings)
        busy = [
            asyncio.create_task(run_once(gpu_s, request(f"cmd {i}", answer_tokens=200)))
            for i in range(3)
        ]
        await asyncio.sleep(0.1)
        router = Router()
        shape = router.shape(request("and now this"))
        servers = [
            candidate("gpu", gpu_s, prefill_tok_s=6000.0),
            candidate("other", other_s, prefill_tok_s=6000.0),
        ]
        gpu_estimate = router.estimate(servers[0], shape, Lane.VOICE, 256, now())
        hold = servers[0].observed.hold_s
        assert gpu_s.load.waiting_ahead(Lane.VOICE) == 2
        assert gpu_estimate.wait_s == pytest.approx(3 * hold)
        assert (
            gpu_s.load.waiting_ahead(Lane.BACKGROUND) == 2
        )  # every lane is ahead of it
        assert router.choose(servers, shape, Lane.VOICE, 256, now()).server == "other"
        await asyncio.gather(*busy)

    run_virtual(main)


def test_background_streams_are_open_slots_to_voice() -> None:
    """Background streams are open slots to voice.

    A box full of background streams still has every slot open to voice (preemption takes
    them back), none to another background request.
    """

    async def main() -> None:
        box = Box("gpu")
        sched = scheduler(
            box, SchedulerSettings(max_sequences=2, server_slots=2, headroom=0)
        )
        jobs = [
            asyncio.create_task(
                run_once(sched, request(f"job {i}", answer_tokens=300), Lane.BACKGROUND)
            )
            for i in range(2)
        ]
        await asyncio.sleep(0.5)
        load = sched.load
        assert load.in_flight == 2 and load.busy
        assert load.open_slots(Lane.VOICE, now()) == 2
        assert load.open_slots(Lane.BACKGROUND, now()) == 0
        await asyncio.gather(*jobs)
        assert not sched.load.busy

    run_virtual(main)


def test_a_gap_beyond_the_lane_s_objective_costs_every_token() -> None:
    """A gap beyond the lane's objective costs every token.

    A box whose tokens come 0.3 s apart (voice's objective: 0.1 s) loses to one that keeps
    the objective, however fast its first token.
    """

    async def main() -> None:
        slow, fast = Box("slow"), Box("fast", costs=MINI_PC_COSTS)
        slow_s, fast_s = scheduler(slow), scheduler(fast)
        slow_s.batch_cost.seed(1, 0.3)
        slow_s.batch_cost.seed(2, 0.3)
        router = Router()
        shape = router.shape(request())
        servers = [
            candidate("slow", slow_s, prefill_tok_s=100_000.0),
            candidate("fast", fast_s, prefill_tok_s=1000.0),
        ]
        slow_estimate = router.estimate(servers[0], shape, Lane.VOICE, 100, now())
        assert slow_estimate.itl_s == pytest.approx(0.3)
        assert slow_estimate.felt_s == pytest.approx(0.5 + 100 * 0.2)
        assert router.choose(servers, shape, Lane.VOICE, 100, now()).server == "fast"
        # Background's objective (1 s a token) is met by both: the preferred one keeps it.
        assert (
            router.choose(servers, shape, Lane.BACKGROUND, 100, now()).server == "slow"
        )

    run_virtual(main)


def test_a_conversation_stays_where_it_went_unless_another_is_clearly_faster() -> None:
    """A conversation stays where it went unless another server is clearly faster.

    Hysteresis, with estimates beyond the objective: a conversation leaves the preferred
    server for one twice as fast, keeps to that one against a server 10 % faster, and leaves
    it for one twice as fast again.
    """

    async def main() -> None:
        a, b = Box("a", costs=MINI_PC_COSTS), Box("b", costs=MINI_PC_COSTS)
        a_s, b_s = scheduler(a), scheduler(b)
        router = Router()
        history = (
            ChatMessage(role="user", content="plan my week"),
            ChatMessage(role="assistant", content="sure, what is on it"),
        )
        chat = request("gym on monday", system=None, history=history)
        shape = router.shape(chat, 3000)
        assert shape.home is not None

        def choose_with_a_at(a_tok_s: float) -> Estimate:
            """Route the chat with server a at ``a_tok_s`` and b at 500 tokens/s."""
            return router.choose(
                [
                    candidate("a", a_s, prefill_tok_s=a_tok_s),
                    candidate("b", b_s, prefill_tok_s=500.0),
                ],
                shape,
                Lane.INTERACTIVE,
                100,
                now(),
            )

        first = choose_with_a_at(250.0)
        assert first.server == "b"
        assert router.incumbent(shape) == "b"
        # A server 10 % faster than the incumbent does not take the conversation...
        stay = choose_with_a_at(550.0)
        assert stay.server == "b"
        # ... one twice as fast does.
        moved = choose_with_a_at(1000.0)
        assert moved.server == "a"
        assert router.incumbent(shape) == "a"
        # A request on its own has no incumbent but the lane's preferred server.
        alone = router.shape(request("hello", system=None), 3000)
        assert alone.home is None

    run_virtual(main)


def test_where_the_server_places_requests_itself_the_pool_s_memory_stands_in() -> None:
    """Ollama-like servers (no slot choice): the prefixes the pool sent there lately count."""

    async def main() -> None:
        box = Box("ollama")
        box.chooses_slots = False
        sched = scheduler(box)
        assert sched.load.holds(Router().shape(request()).keys) is None
        router = Router()
        shape = router.shape(request())
        server = candidate("ollama", sched)
        assert router.estimate(server, shape, Lane.VOICE, 10, now()).cached_tokens == 0
        server.recent.note(shape.keys)
        assert (
            router.estimate(server, shape, Lane.VOICE, 10, now()).cached_tokens
            == shape.stable_tokens
        )

    run_virtual(main)


def test_recent_prefixes_forget_the_oldest() -> None:
    """The memory holds the latest prefixes only."""
    router = Router()
    memory = RecentPrefixes(2)
    first = router.shape(request(system="one")).keys
    second = router.shape(request(system="two")).keys
    memory.note(first)
    memory.note(second)
    assert memory.holds(first) == (False, False)  # its two keys were pushed out
    assert memory.holds(second) == (True, True)


def test_prompt_shapes() -> None:
    """What routing needs of a prompt.

    The stable prefix is the system prompt and tools; the history everything before the last
    user message; a conversation with earlier turns has a home, a command none.
    """
    router = Router()
    tool = ToolSpec(name="HassTurnOn", description="turn on", parameters={"a": 1})
    command = request("turn on the light", tools=(tool,))
    shape = router.shape(command)
    assert shape.stable_tokens > 2000
    assert shape.history_tokens == shape.stable_tokens
    assert shape.tokens > shape.stable_tokens
    assert shape.home is None
    chat = request(
        "and the kitchen",
        history=(
            ChatMessage(role="user", content="turn on the light " * 50),
            ChatMessage(role="assistant", content="done"),
        ),
    )
    chat_shape = router.shape(chat)
    assert chat_shape.history_tokens > chat_shape.stable_tokens
    assert chat_shape.home == chat_shape.keys.conversation is not None
    assert router.shape(chat, 10).tokens == 10
    assert router.shape(chat, 10).stable_tokens == 10


def test_capabilities_say_what_a_server_cannot_serve() -> None:
    """Model, tools, JSON schema and context; a request naming no model runs as the server's."""
    tool = ToolSpec(name="t", description="", parameters={})
    caps = Capabilities(
        model="qwen3:8b",
        models=("qwen3:8b",),
        context_tokens=4096,
        tools=False,
        json_schema=False,
    )
    plain = ChatRequest(
        model=ANY_MODEL, messages=(ChatMessage(role="user", content="x"),)
    )
    assert caps.model_for(plain) == "qwen3:8b"
    assert caps.refusal(plain, 100, 100) is None
    assert caps.refusal(replace(plain, model="llama3"), 100, 100) == (
        "it does not serve the model llama3"
    )
    assert (
        caps.refusal(replace(plain, tools=(tool,)), 100, 100)
        == "it does not take tools"
    )
    assert caps.refusal(replace(plain, json_schema={"type": "object"}), 100, 100) == (
        "it does not follow JSON schemas"
    )
    assert "exceed its context of 4096" in (caps.refusal(plain, 4000, 200) or "")
    assert Capabilities().model_for(plain) is None  # no model of its own: names one
    assert Capabilities().model_for(replace(plain, model="any")) == "any"


def _record(
    prompt: int, ttft: float, *, wait: float = 0.0, e2e: float = 1.0
) -> FinishedRequest:
    return FinishedRequest(
        request_id="1",
        lane=Lane.VOICE,
        requester="u",
        outcome="ok",
        error=None,
        queue_wait_s=wait,
        ttft_s=wait + ttft,
        itl_p95_s=None,
        itl_max_s=None,
        e2e_s=wait + e2e,
        prompt_tokens=prompt,
        output_tokens=10,
        token_source="server",
        preemptions=0,
        met_ttft=True,
        met_itl=True,
    )


def test_observed_fits_the_prefill_line_and_the_slot_hold() -> None:
    """Observed fits the prefill line and the slot hold.

    From requests' (evaluated tokens, admission to first token) the prefill line is fitted
    (0.05 s + 1 ms a token here); evaluated tokens are the server's, net of its cache; the
    scheduler's learned speed wins where it has one.
    """
    observed = Observed(100.0)
    assert observed.prefill_s(1000, None) == pytest.approx(10.0)  # the prior
    for tokens in (100, 500, 1000, 2000, 4000):
        usage = TokenUsage(tokens + 3000, 10, "server", cached_prompt_tokens=3000)
        observed.learn(_record(tokens + 3000, 0.05 + tokens / 1000, wait=0.5), usage)
    assert observed.prefill_s(3000, None) == pytest.approx(3.05, rel=1e-6)
    assert observed.prefill_s(3000, 1000.0) == pytest.approx(3.05)
    # A learned speed the requests contradict: the overhead takes the median of the rest.
    assert observed.prefill_s(3000, 2000.0) == pytest.approx(1.5 + 0.55)
    assert observed.hold_s < 2.0  # moving from the prior (2 s) towards 1 s
    # One size only: a speed through the origin.
    single = Observed(100.0)
    single.learn(_record(2000, 0.4), None)
    assert single.prefill_s(1000, None) == pytest.approx(0.2)
    failed = replace(_record(2000, 9.0), outcome="error")
    single.learn(failed, None)
    assert single.prefill_s(1000, None) == pytest.approx(0.2)


def test_the_routing_micro_benchmark_times_every_decision() -> None:
    """``scripts/bench micro`` times the pool's decision (the figure goes to the README)."""
    costs = micro.bench_route(servers=2, iterations=50)
    assert len(costs) == 50
    assert all(cost > 0 for cost in costs)
