"""Micro-benchmark of the engine's hot paths: choosing the next request, accounting a token, routing.

    scripts/bench micro [--queued 10000] [--requesters 100]

Prints the median cost of

- **choose-next**: the ``lanes`` policy's ``choose`` with ``--queued`` requests waiting over ``--requesters``
  requesters in the four lanes (aging, background share and fairness counters all in play; after
  each choice the request is started, charged, released and replaced, so the queue stays full and
  the counters keep moving);
- **per-token accounting**: the charge of one streamed token (``Accounting.charge_chunk``:
  fairness counter, background share, rates, inter-token gap) on an admitted request;
- **route**: a pool's routing decision for one voice command (``ServerPool.place``: the prompt's
  prefixes hashed and sized, each server's estimate, the choice) among three llama.cpp servers,
  for an Assist prompt of 2,600 tokens with 20 tools.

Targets: choose-next <= 50 us, per-token accounting <= 5 us (the scheduler-core issue), route <=
200 us (the several-servers issue).
``--check`` makes the exit status 1 when a median misses its target.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
import random
import statistics
import sys
import time

import aiohttp

from custom_components.llm_lanes.core.accounting import Accounting
from custom_components.llm_lanes.core.availability import answers
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.foreground import Foreground
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    ToolSpec,
)
from custom_components.llm_lanes.core.policy import Admit, create_policy
from custom_components.llm_lanes.core.pool import ServerPool
from custom_components.llm_lanes.core.pool_members import PoolMember
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.router import ANY_MODEL, Capabilities
from custom_components.llm_lanes.core.run_state import QueuedRequest, RunState
from custom_components.llm_lanes.core.scheduler import DEFAULT_WINDOW_S, Scheduler
from custom_components.llm_lanes.core.settings import Policy, SchedulerSettings
from custom_components.llm_lanes.core.ticket import Ticket

CHOOSE_TARGET_US = 50.0
TOKEN_TARGET_US = 5.0
ROUTE_TARGET_US = 200.0
TOKEN_BATCH = 100
"""Accounting calls timed together (one call is too short for the timer)."""


def bench_choose(
    queued: int, requesters: int, iterations: int, seed: int = 1
) -> list[float]:
    """Time ``choose`` (microseconds per call) on a full queue."""
    rng = random.Random(seed)
    settings = SchedulerSettings(max_sequences=4, headroom=1, aging_s=30.0)
    state = RunState(settings)
    foreground = Foreground(settings.max_sequences)
    policy = create_policy(Policy.LANES)
    lanes = LANES
    names = [f"user{index}" for index in range(requesters)]
    start = 1000.0
    seq = 0

    def new_request(now: float) -> QueuedRequest:
        nonlocal seq
        seq += 1
        return QueuedRequest(
            seq=seq,
            lane=rng.choice(lanes),
            requester=rng.choice(names),
            prompt_tokens=rng.randint(50, 2000),
            enqueued_at=now,
        )

    for index in range(queued):
        state.push(new_request(start + 100.0 * index / queued))
    now = start + 100.0
    timings: list[float] = []
    for _ in range(iterations):
        before = time.perf_counter_ns()
        decision = policy.choose(state, foreground, now)
        after = time.perf_counter_ns()
        timings.append((after - before) / 1000)
        assert isinstance(decision, Admit)
        request = decision.request
        state.start(request)
        counters = state.counters.lane(request.lane)
        counters[request.requester] += request.prompt_tokens + 2 * rng.randint(1, 400)
        state.share.add(now, request.prompt_tokens, background=request.lane.yields)
        state.release(request)
        now += 0.001
        state.push(new_request(now))
    return timings


def bench_token(batches: int) -> list[float]:
    """Time the accounting of one streamed token (microseconds per token).

    The token is charged on an admitted request, as the scheduler's pump charges it.
    """
    settings = SchedulerSettings()
    state = RunState(settings)
    accounting = Accounting(state, window_s=DEFAULT_WINDOW_S)
    now = 1000.0
    queued = QueuedRequest(
        seq=1,
        lane=Lane.INTERACTIVE,
        requester="bench",
        prompt_tokens=4,
        enqueued_at=now,
    )
    ticket = Ticket(
        queued=queued,
        request=ChatRequest(
            model="m", messages=(ChatMessage(role="user", content="hi"),)
        ),
        counters=state.counters.lane(queued.lane),
        lane_stats=accounting.lane_stats[queued.lane],
        requester_stats=accounting.stats_of(queued.requester),
        sink=None,
    )
    state.push(queued)
    state.start(queued)
    accounting.charge_prompt(ticket, now)
    account = accounting.charge_chunk
    chunk = StreamChunk(text="word", output_tokens=1)
    timings: list[float] = []
    for _ in range(batches):
        before = time.perf_counter_ns()
        for _ in range(TOKEN_BATCH):
            now += 0.02
            account(ticket, chunk, now)
        after = time.perf_counter_ns()
        timings.append((after - before) / 1000 / TOKEN_BATCH)
        # Keep the kept text short, as a real stream's would be between snapshots.
        ticket.parts.clear()
        ticket.gaps.clear()
    return timings


def bench_route(servers: int, iterations: int) -> list[float]:
    """Time a pool's routing decision for one voice command (microseconds per decision).

    The servers are llama.cpp clients of addresses never contacted; their schedulers have
    learned a batch-cost curve, so every estimate is worked out in full.
    """

    async def run() -> list[float]:
        async with aiohttp.ClientSession() as session:
            ledger = QuotaLedger()
            members = []
            for index in range(servers):
                backend = OpenAIBackend(
                    session,
                    f"http://server{index}.invalid:8080",
                    kind=ServerKind.LLAMA_CPP,
                )
                scheduler = Scheduler(
                    backend,
                    SchedulerSettings(max_sequences=4, server_slots=4),
                    quotas=ledger,
                )
                for sequences in range(1, 5):
                    scheduler.batch_cost.seed(sequences, 0.01 * sequences)
                members.append(
                    PoolMember(
                        name=f"server{index}",
                        scheduler=scheduler,
                        health=answers(backend),
                        capabilities=Capabilities(model="m"),
                    )
                )
            pool = ServerPool(members, quotas=ledger)
            tools = tuple(
                ToolSpec(
                    name=f"Hass{index}",
                    description="Turns on or off a device of the home " * 3,
                    parameters={
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                    },
                )
                for index in range(20)
            )
            timings: list[float] = []
            for index in range(iterations):
                request = ChatRequest(
                    model=ANY_MODEL,
                    messages=(
                        ChatMessage(
                            role="system", content="entity: light.kitchen; " * 440
                        ),
                        ChatMessage(role="user", content=f"turn on light {index}"),
                    ),
                    tools=tools,
                )
                before = time.perf_counter_ns()
                pool.place(request, Lane.VOICE)
                after = time.perf_counter_ns()
                timings.append((after - before) / 1000)
            await pool.close()
            return timings

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    """Run both micro-benchmarks and print their medians."""
    parser = argparse.ArgumentParser(
        prog="bench micro", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--requesters", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a target is missed"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)

    choose = bench_choose(args.queued, args.requesters, args.iterations)
    token = bench_token(max(args.iterations // TOKEN_BATCH, 10))
    route = bench_route(3, max(args.iterations // 10, 100))
    choose_median = statistics.median(choose)
    token_median = statistics.median(token)
    route_median = statistics.median(route)
    rows = [
        (
            f"choose-next ({args.queued} queued, {args.requesters} requesters, 4 lanes)",
            choose_median,
            statistics.quantiles(choose, n=100)[98],
            CHOOSE_TARGET_US,
        ),
        ("per-token accounting", token_median, max(token), TOKEN_TARGET_US),
        (
            "route a voice command (3 servers, 2,600-token prompt)",
            route_median,
            statistics.quantiles(route, n=100)[98],
            ROUTE_TARGET_US,
        ),
    ]
    out = sys.stdout
    out.write(f"{'operation':<60} {'median us':>10} {'p99/max us':>11} {'target':>7}\n")
    for name, median, tail, target in rows:
        verdict = "ok" if median <= target else "MISSED"
        out.write(
            f"{name:<60} {median:>10.2f} {tail:>11.2f} {target:>7.0f} {verdict}\n"
        )
    missed = (
        choose_median > CHOOSE_TARGET_US
        or token_median > TOKEN_TARGET_US
        or route_median > ROUTE_TARGET_US
    )
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
