"""Micro-benchmark of the scheduler's hot paths: choosing the next request, accounting a token.

    scripts/bench micro [--queued 10000] [--requesters 100]

Prints the median cost of

- **choose-next**: the ``lanes`` policy's ``choose`` with ``--queued`` requests waiting over ``--requesters``
  requesters in the four lanes (aging, background share and fairness counters all in play; after
  each choice the request is started, charged, released and replaced, so the queue stays full and
  the counters keep moving);
- **per-token accounting**: the charge of one streamed token (``Accounting.charge_chunk``:
  fairness counter, background share, rates, inter-token gap) on an admitted request.

Targets from the scheduler-core issue: choose-next <= 50 us, per-token accounting <= 5 us.
``--check`` makes the exit status 1 when a median misses its target.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import random
import statistics
import sys
import time

from custom_components.llm_lanes.core.accounting import Accounting
from custom_components.llm_lanes.core.foreground import Foreground
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest, StreamChunk
from custom_components.llm_lanes.core.policy import Admit, create_policy
from custom_components.llm_lanes.core.run_state import QueuedRequest, RunState
from custom_components.llm_lanes.core.scheduler import DEFAULT_WINDOW_S
from custom_components.llm_lanes.core.settings import Policy, SchedulerSettings
from custom_components.llm_lanes.core.ticket import Ticket

CHOOSE_TARGET_US = 50.0
TOKEN_TARGET_US = 5.0
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
    choose_median = statistics.median(choose)
    token_median = statistics.median(token)
    rows = [
        (
            f"choose-next ({args.queued} queued, {args.requesters} requesters, 4 lanes)",
            choose_median,
            statistics.quantiles(choose, n=100)[98],
            CHOOSE_TARGET_US,
        ),
        ("per-token accounting", token_median, max(token), TOKEN_TARGET_US),
    ]
    out = sys.stdout
    out.write(f"{'operation':<60} {'median us':>10} {'p99/max us':>11} {'target':>7}\n")
    for name, median, tail, target in rows:
        verdict = "ok" if median <= target else "MISSED"
        out.write(
            f"{name:<60} {median:>10.2f} {tail:>11.2f} {target:>7.0f} {verdict}\n"
        )
    missed = choose_median > CHOOSE_TARGET_US or token_median > TOKEN_TARGET_US
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
