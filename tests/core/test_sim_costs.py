"""The simulator's model of llama-server's own costs, each mechanism alone, on virtual time."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from tools.bench.servers import _costs, parse_server
from tools.simulator.costs import COSTS, EngineCosts, HostCacheCosts
from tools.simulator.engine import Engine, Sequence
from tools.simulator.host_cache import HostCache
from tools.simulator.inprocess import EngineBackend
from tools.simulator.virtual_time import VirtualTimeLoop

BARE = EngineCosts(fixed_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.001)
"""Round costs without any of llama-server's mechanics."""
CACHE = HostCacheCosts(
    save_s=0.3,
    save_per_token_s=0.001,
    load_s=0.2,
    load_per_token_s=0.0005,
    capacity_tokens=10_000,
)


def run[T](main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` on a virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main())  # type: ignore[arg-type]


def engine(costs: EngineCosts, slots: int = 2) -> Engine:
    """Start an engine on the running loop's clock."""
    made = Engine(
        slots=slots,
        kv_capacity_tokens=1 << 20,
        prefill_chunk_tokens=None,
        costs=costs,
        clock=asyncio.get_running_loop().time,
    )
    made.start()
    return made


async def times(seq: Sequence) -> list[float]:
    """Return when each of a sequence's tokens came."""
    loop = asyncio.get_running_loop()
    stamps = []
    while await seq.tokens.get() is not None:
        stamps.append(loop.time())
    return stamps


def text(seed: str, tokens: int) -> str:
    """Return a prompt of ``tokens`` tokens (four characters each) no other seed shares."""
    return (seed * (tokens * 4))[: tokens * 4]


# --- passes -------------------------------------------------------------------------------------


def test_a_pass_costs_its_floor_up_to_a_few_hundred_tokens_then_grows() -> None:
    """gpu-fa-off: 40 prompt tokens cost what 200 do; 1,000 cost 0.063 ms each."""
    costs = COSTS["gpu-fa-off"]
    assert costs.pass_seconds(40, 1, 0) == costs.pass_seconds(200, 1, 0) == 0.013
    assert costs.pass_seconds(1000, 1, 0) == pytest.approx(0.063)
    assert costs.pass_seconds(1000, 2, 3) == pytest.approx(0.063 + 0.009 + 3 * 0.0007)
    assert costs.pass_seconds(1000, 2, 0) - costs.pass_seconds(
        1000, 1, 0
    ) == pytest.approx(0.009)
    assert COSTS["gpu"].per_other_prompt_s == 0


def test_decoding_costs_by_batch_size_as_measured() -> None:
    """The H200 curve: 5.3 ms with one sequence, 6.8 + 0.63 B ms with B of two or more."""
    costs = COSTS["gpu-fa-off"]
    fitted = [costs.pass_seconds(0, 0, b) for b in (1, 2, 3, 4)]
    measured = [0.0053, 0.0080, 0.0086, 0.0093]
    assert fitted == pytest.approx(measured, abs=0.0002)

    async def main() -> tuple[list[float], list[float]]:
        sim = engine(replace(costs, task_overhead_s=0.0, host_cache=None))
        alone = await times(sim.submit(10, 5))
        pair = sim.submit(10, 5), sim.submit(10, 5)
        both = await asyncio.gather(*(times(seq) for seq in pair))
        return alone, both[0]

    alone, paired = run(main)
    assert alone[2] - alone[1] == pytest.approx(0.0053)
    assert paired[2] - paired[1] == pytest.approx(0.0068 + 2 * 0.00063)


def test_the_published_profile_keeps_the_old_formula() -> None:
    """The code's default costs: fixed + per prompt token + per decoding sequence, nothing more."""
    costs = EngineCosts()
    assert costs == COSTS["gpu-published"]
    assert costs.pass_seconds(100, 2, 3) == pytest.approx(0.008 + 0.015 + 0.0045)
    assert costs.pass_seconds(0, 0, 1) == pytest.approx(0.0095)
    assert costs.host_cache is None
    assert costs.task_overhead_s == costs.cancel_notice_s == 0


def test_every_task_launched_blocks_the_loop_its_overhead() -> None:
    """The first token comes after the task's overhead and the pass."""

    async def main() -> tuple[float, float]:
        plain, loaded = engine(BARE), engine(replace(BARE, task_overhead_s=0.05))
        first = (await times(plain.submit(10, 1)))[0]
        start = asyncio.get_running_loop().time()
        second = (await times(loaded.submit(10, 1)))[0] - start
        return first, second

    plain, loaded = run(main)
    assert plain == pytest.approx(0.02)
    assert loaded == pytest.approx(plain + 0.05)


# --- the host prompt cache ----------------------------------------------------------------------


async def fill(sim: Engine, prompt: str, tokens: int, answer: int = 1) -> None:
    """Serve one request to its end (its slot keeps the prompt and the answer)."""
    await times(sim.submit(tokens, answer, prompt_text=prompt, pieces=("x",) * answer))


def test_a_slot_taken_by_least_recent_use_is_saved_first_and_the_loop_waits() -> None:
    """A new prompt on a used slot: a save of its 100 tokens (0.4 s) before anything else runs."""

    async def main() -> tuple[Engine, list[float]]:
        sim = engine(replace(BARE, host_cache=CACHE), slots=1)
        await fill(sim, text("a", 99), 99)
        start = asyncio.get_running_loop().time()
        first = (await times(sim.submit(10, 1, prompt_text=text("b", 10))))[0] - start
        return sim, [first]

    sim, (first,) = run(main)
    assert sim.stats.saves_total == 1
    assert sim.stats.loads_total == 0
    assert first == pytest.approx(0.3 + 0.001 * 100 + 0.01 + 0.001 * 10)


def test_a_request_that_keeps_most_of_its_slot_saves_nothing() -> None:
    """The same Assist prompt again: the slot is kept, nothing is copied."""

    async def main() -> Engine:
        sim = engine(replace(BARE, host_cache=CACHE), slots=1)
        shared = text("p", 100)
        await fill(sim, shared + "q1", 101)
        await fill(sim, shared + "q2", 101)
        return sim

    sim = run(main)
    assert sim.stats.saves_total == 0
    assert sim.stats.host_cache_seconds_total == 0


def test_a_saved_prompt_is_loaded_into_the_slot_and_leaves_the_cache() -> None:
    """Assist's prompt, pushed out of its slot, comes back by a load instead of a prefill."""

    async def main() -> tuple[Engine, Sequence]:
        sim = engine(replace(BARE, host_cache=CACHE), slots=1)
        assist = text("p", 100)
        await fill(sim, assist + "q1", 101)
        await fill(sim, text("s", 100), 100)  # saves Assist's slot
        seq = sim.submit(101, 1, prompt_text=assist + "q2")
        await times(seq)
        return sim, seq

    sim, seq = run(main)
    assert sim.stats.loads_total == 1
    assert seq.cached_prompt_tokens >= 99
    assert sim.host_cache is not None
    assert not any(entry.text.startswith("pppp") for entry in sim.host_cache.entries)


def test_every_launch_saves_the_idle_slots_whose_content_changed() -> None:
    """With ``--cache-idle-slots`` a launch elsewhere copies an idle slot's new content once."""

    async def main(idle_slots: bool) -> Engine:
        sim = engine(
            replace(BARE, host_cache=replace(CACHE, idle_slots=idle_slots)), slots=2
        )
        assist = text("p", 100)
        await fill(sim, assist + "q1", 101)  # slot 0 changed
        await fill(sim, assist + "q2", 101)  # slot 0 again (kept): nothing saved
        second = sim.submit(50, 1, prompt_text=text("z", 50), slot=1)
        await times(second)  # launching on slot 1 saves slot 0
        third = sim.submit(50, 1, prompt_text=text("z", 50) + "y", slot=1)
        await times(third)  # slot 0 unchanged since: nothing
        return sim

    assert run(lambda: main(True)).stats.saves_total == 1
    assert run(lambda: main(False)).stats.saves_total == 0


def test_naming_a_busy_slot_defers_the_request_and_saves_that_slot_first() -> None:
    """``id_slot`` on a busy slot: the request waits for it, then the slot is saved."""

    async def main() -> tuple[Engine, Sequence, Sequence]:
        sim = engine(replace(BARE, host_cache=replace(CACHE, idle_slots=False)), 2)
        busy = sim.submit(60, 5, prompt_text=text("a", 60), slot=0)
        await asyncio.sleep(0.001)
        named = sim.submit(60, 1, prompt_text=text("a", 60) + "more", slot=0)
        await asyncio.gather(times(busy), times(named))
        return sim, busy, named

    sim, busy, named = run(main)
    assert named.deferred
    assert sim.stats.saves_total == 1


def test_the_host_cache_drops_its_oldest_prompts_past_its_size() -> None:
    """``--cache-ram``: the oldest entries go; a prompt held whole is not saved again."""
    cache = HostCache(capacity_tokens=250)
    assert cache.save("aaaa", 100)
    assert cache.save("bbbb", 100)
    assert not cache.save("bb", 50)  # held whole already
    assert cache.save("cccc", 100)
    assert [entry.text for entry in cache.entries] == ["bbbb", "cccc"]
    assert cache.evicted == 1
    assert cache.save("ccccdd", 110)  # it contains the older one, which goes
    assert [entry.text for entry in cache.entries] == ["bbbb", "ccccdd"]


# --- cancellation and the tokenizer -------------------------------------------------------------


def test_a_cancelled_stream_holds_its_slot_until_the_server_notices() -> None:
    """``cancel_notice_s``: the slot stays busy (and decodes) that long after the close."""

    async def main(notice: float) -> list[tuple[float, bool]]:
        sim = engine(replace(BARE, cancel_notice_s=notice), slots=1)
        seq = sim.submit(10, 1000)
        await seq.tokens.get()
        sim.cancel(seq)
        seen = []
        for _ in range(3):
            seen.append((asyncio.get_running_loop().time(), seq in sim.running))
            await asyncio.sleep(0.3)
        return seen

    noticed = run(lambda: main(0.5))
    assert [busy for _, busy in noticed] == [True, True, False]
    assert [busy for _, busy in run(lambda: main(0.0))] == [False, False, False]


def test_the_servers_tokenizer_counts_differently_from_our_estimate() -> None:
    """``tokens_per_estimate``: the server reports (and pays for) its own count."""

    async def main(costs: EngineCosts) -> Any:
        backend = EngineBackend(slots=1, costs=costs)
        request = ChatRequest(
            model="engine",
            messages=(ChatMessage(role="user", content="x" * 400),),
            max_tokens=2,
        )
        chunks = [chunk async for chunk in backend.chat(request)]
        await backend.engine.stop()
        return chunks[-1].usage

    plain = run(lambda: main(BARE))
    counted = run(lambda: main(replace(BARE, tokens_per_estimate=1.55)))
    assert counted.prompt_tokens == round(plain.prompt_tokens * 1.55)


def test_a_slower_machine_scales_every_cost() -> None:
    """``slower``: each second of the profile, host cache included, that many times."""
    costs = COSTS["gpu-fa-off"]
    slow = costs.scaled(2.0)
    assert slow.pass_seconds(1000, 2, 3) == pytest.approx(
        2 * costs.pass_seconds(1000, 2, 3)
    )
    assert slow.host_cache is not None and costs.host_cache is not None
    assert slow.host_cache.save_seconds(1000) == pytest.approx(
        2 * costs.host_cache.save_seconds(1000)
    )
    assert slow.without_host_cache().host_cache is None


def test_the_benchmark_picks_a_profile_and_turns_its_host_cache_off() -> None:
    """``--server engine:costs=gpu-fa-off,host-cache=off``; a bad value is refused, naming it."""
    args = argparse.Namespace(sim_costs="gpu-published")
    on = _costs(args, parse_server("engine:costs=gpu-fa-off"))
    off = _costs(args, parse_server("engine:costs=gpu-fa-off,host-cache=off"))
    assert on == COSTS["gpu-fa-off"]
    assert off == replace(COSTS["gpu-fa-off"], host_cache=None)
    assert _costs(args, parse_server("engine")) == EngineCosts()
    with pytest.raises(ValueError, match="host-cache=maybe"):
        _costs(args, parse_server("engine:host-cache=maybe"))
    with pytest.raises(ValueError, match="costs=tpu"):
        _costs(args, parse_server("engine:costs=tpu"))
