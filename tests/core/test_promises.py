"""The promises, checked all together on generated mixed workloads.

Each example runs one household's evening for a minute or two of virtual time: a scheduler with
its **default settings** (every voice-first mechanism on) in front of the simulator's engine (its
continuous batching, slots, prompt caches and iteration costs: a GPU's, or a CPU's on which a
second sequence nearly doubles every gap), on an event loop whose clock jumps instead of waiting.
The workload mixes voice commands (bursts, on Home Assistant's shared Assist prompt or short,
announced beforehand by ``prepare`` or not), typed chats in closed loop, automations, nightly
summaries with long prompts in closed loop, quotas, and server errors. After it, every promise is
checked at once:

1. **The background share**: over every window of ``share_window_s`` in which background had work
   waiting throughout, it received at least ``background_share`` of the weighted service
   (prompt weight 1, output weight 2), less one request's cost.
2. **Progress**: no request is preempted more than ``max_preemptions`` times; a request that is not
   urgent nor background ranks with interactive after ``(place - 1) * aging_s`` and is served
   before every request of another lane that arrived after it, voice and the share aside.
3. **Fairness inside a lane** (Virtual Token Counter): two requesters of one lane, both waiting
   throughout an interval, got weighted service within ``2 * max(w_in * L, w_out * M)`` of each
   other (Sheng et al., OSDI 2024, Theorem 4.1: L the longest prompt, M what the running batch
   holds).
4. **Quotas hold within one request**: what a requester with a quota was served in its own lane is
   at most its quota plus one request (prompt and output limit).
5. **Every request ends exactly once and frees its slot**; a preempted answer reaches its caller
   whole and in order; nothing is left at the server.
6. **Voice is never locked out**: a voice command that has waited longer than ``VOICE_WAIT_S``
   finds at least ``headroom`` slots held by the foreground (voice, typed chats): background that
   can no longer be preempted never takes the headroom, so voice waits only behind the
   foreground.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field, replace
import math
import random
from unittest.mock import patch

from hypothesis import (
    HealthCheck,
    example,
    given,
    settings as hyp_settings,
    strategies as st,
)
import pytest

from custom_components.llm_lanes.core.attempts import Attempts
from custom_components.llm_lanes.core.errors import LanesError
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.run_state import QueuedRequest
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from custom_components.llm_lanes.core.ticket import Ticket
from tools.simulator.engine import COSTS
from tools.simulator.inprocess import EngineBackend, answer_text, filler
from tools.simulator.virtual_time import VirtualTimeLoop

ASSIST_TOKENS = 2000
SAMPLE_S = 0.05
"""How often the backlog is sampled."""
VOICE_WAIT_S = 1.0
"""How long a voice command may wait before the foreground must hold the headroom (a preemption
takes effect within an iteration)."""
EXAMPLES = hyp_settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class Household:
    """The shape of one generated evening (the requests come from ``seed``)."""

    seed: int
    costs: str
    """A profile of ``tools/simulator/costs.py``: "gpu", "gpu-fa-off", "cpu", "gpu-published"."""
    chooses_slots: bool
    duration_s: float
    voice_per_s: float
    voice_bursts: bool
    assist_prompt: bool
    announced: bool
    chats: int
    """Closed-loop typed-chat clients."""
    chat_depth: int
    """Requests each chat client keeps waiting."""
    chat_prompt: tuple[int, int]
    automations_per_s: float
    summaries: int
    """Closed-loop summary clients (two requesters)."""
    summary_prompt: tuple[int, int]
    summary_answer: tuple[int, int]
    failure_rate: float
    share: float
    window_s: float
    quota: int
    """Daily quota of the automation requester ``automation.quota`` (0: none)."""
    host_cache: bool = True
    """The server's host prompt cache, where its profile has one (off: ``--cache-ram 0``)."""


households = st.builds(
    Household,
    seed=st.integers(0, 2**16),
    costs=st.sampled_from(["gpu", "cpu"]),
    chooses_slots=st.booleans(),
    duration_s=st.sampled_from([90.0, 120.0]),
    voice_per_s=st.sampled_from([0.0, 0.2, 0.5]),
    voice_bursts=st.booleans(),
    assist_prompt=st.booleans(),
    announced=st.booleans(),
    chats=st.integers(0, 2),
    chat_depth=st.integers(1, 6),
    chat_prompt=st.sampled_from([(50, 300), (100, 1500)]),
    automations_per_s=st.sampled_from([0.0, 0.15]),
    summaries=st.integers(1, 3),
    summary_prompt=st.sampled_from([(200, 600), (500, 1000), (1500, 2500)]),
    summary_answer=st.sampled_from([(50, 150), (200, 350)]),
    failure_rate=st.sampled_from([0.0, 0.05]),
    share=st.sampled_from([0.1, 0.2]),
    window_s=st.sampled_from([30.0, 60.0]),
    quota=st.sampled_from([0, 3000]),
)

ITEM_1 = Household(
    # #19 item 1: two typed-chat requesters keeping 12 requests waiting (100-1,500-token prompts),
    # one summary requester keeping 2 (500-1,000-token prompts), share 0.2, four slots.
    seed=1,
    costs="gpu",
    chooses_slots=True,
    duration_s=90.0,
    voice_per_s=0.0,
    voice_bursts=False,
    assist_prompt=False,
    announced=False,
    chats=2,
    chat_depth=6,
    chat_prompt=(100, 1500),
    automations_per_s=0.0,
    summaries=2,
    summary_prompt=(500, 1000),
    summary_answer=(200, 350),
    failure_rate=0.0,
    share=0.2,
    window_s=60.0,
    quota=0,
)
ITEM_2 = replace(
    # #19 item 2: a CPU server, bursty voice commands at 0.5/s, automations at 0.15/s, three
    # summaries of ~1,500 prompt and ~350 output tokens in closed loop, the default share.
    ITEM_1,
    seed=2,
    costs="cpu",
    voice_per_s=0.5,
    voice_bursts=True,
    chats=0,
    automations_per_s=0.15,
    summaries=3,
    summary_prompt=(1500, 2500),
    share=0.1,
)


@dataclass
class Evening:
    """What happened: the records, the service given, the backlog sampled, the admissions."""

    settings: SchedulerSettings
    finished: list[FinishedRequest] = field(default_factory=list)
    submitted: int = 0
    served: list[tuple[float, str, str, float]] = field(default_factory=list)
    """(time, run lane key, requester, weighted service)."""
    samples: list[tuple[float, frozenset[tuple[str, str]]]] = field(
        default_factory=list
    )
    """(time, the (lane, requester) pairs with a request waiting)."""
    lockouts: list[str] = field(default_factory=list)
    """Samples in which voice had waited past ``VOICE_WAIT_S`` beside too few foreground slots."""
    admissions: list[tuple[float, QueuedRequest, float, list[QueuedRequest]]] = field(
        default_factory=list
    )
    """(time, the request admitted, its rank, the requests then waiting)."""
    largest_cost: float = 0.0
    longest_prompt: int = 0
    largest_request: int = 0
    max_output: dict[str, int] = field(default_factory=dict)


def _settings(household: Household) -> SchedulerSettings:
    settings = SchedulerSettings(
        max_sequences=4,
        server_slots=4 if household.chooses_slots else None,
        background_share=household.share,
        share_window_s=household.window_s,
        requester_quotas={"automation.quota": household.quota}
        if household.quota
        else {},
    )
    # Closed-loop clients keep more waiting than the defaults allow; nobody times out.
    for lane in LANES:
        settings = settings.with_lane(lane, max_queued=1000, max_wait_s=3600.0)
    return settings


def _request(
    rng: random.Random,
    key: str,
    requester: str,
    *,
    prompt: int,
    answer: int,
    assist: bool,
    failure_rate: float,
) -> ChatRequest:
    system = filler(ASSIST_TOKENS, "assist") if assist else filler(8, key)
    user = filler(max(1, prompt - (ASSIST_TOKENS if assist else 8)), key)
    options: dict[str, object] = {
        "prompt_tokens": prompt,
        "answer_tokens": answer,
        "key": key,
        "who": requester,
    }
    roll = rng.random()
    if roll < failure_rate / 2:
        options["fail"] = "connect"
    elif roll < failure_rate:
        options["fail"] = rng.randint(0, max(0, answer - 1))
    return ChatRequest(
        model="engine",
        messages=(
            ChatMessage(role="system", content=system),
            ChatMessage(role="user", content=user),
        ),
        max_tokens=answer,
        options=options,
    )


async def _evening(household: Household) -> Evening:
    loop = asyncio.get_running_loop()
    rng = random.Random(household.seed)
    costs = COSTS[household.costs]
    backend = EngineBackend(
        chooses_slots=household.chooses_slots,
        costs=costs if household.host_cache else costs.without_host_cache(),
    )
    settings = _settings(household)
    scheduler = Scheduler(backend, settings, clock=loop.time)
    evening = Evening(settings)
    scheduler.add_listener(evening.finished.append)
    start = loop.time()
    end = start + household.duration_s
    keys = iter(range(1, 10**9))

    # Admissions, with the requests waiting then (to check aging's order).
    def start_attempt(self: Attempts, ticket: Ticket, now: float, rank: float) -> None:
        waiting = [t.queued for t in scheduler._tickets.values() if t.queued.waiting]
        evening.admissions.append((now, ticket.queued, rank, waiting))
        admit(self, ticket, now, rank)

    admit = Attempts.start
    spy = patch.object(Attempts, "start", start_attempt)

    async def call(
        lane: Lane, requester: str, prompt: int, answer: int, *, assist: bool = False
    ) -> None:
        key = f"r{next(keys)}"
        request = _request(
            rng,
            key,
            requester,
            prompt=prompt,
            answer=answer,
            assist=assist,
            failure_rate=household.failure_rate,
        )
        evening.largest_cost = max(evening.largest_cost, prompt + 2 * answer)
        evening.longest_prompt = max(evening.longest_prompt, prompt)
        evening.largest_request = max(evening.largest_request, prompt + answer)
        evening.submitted += 1
        try:
            text = [
                chunk.text
                async for chunk in scheduler.stream(
                    request, lane=lane, requester=requester, prompt_tokens=prompt
                )
            ]
        except LanesError:
            return
        # One seamless answer however often it was preempted.
        assert "".join(text) == answer_text(0, answer), key

    async def closed_loop(
        lane: Lane,
        requester: str,
        prompts: tuple[int, int],
        answers: tuple[int, int],
    ) -> None:
        while loop.time() < end:
            await call(lane, requester, rng.randint(*prompts), rng.randint(*answers))

    async def arrivals(per_s: float, bursts: bool, send) -> None:  # type: ignore[no-untyped-def]
        tasks = []
        while per_s > 0:
            gap = rng.expovariate(per_s / (3 if bursts else 1))
            await asyncio.sleep(gap)
            if loop.time() >= end:
                break
            for _ in range(rng.randint(1, 5) if bursts else 1):
                tasks.append(asyncio.create_task(send()))
                await asyncio.sleep(rng.uniform(0.05, 0.6) if bursts else 0)
        await asyncio.gather(*tasks)

    async def voice() -> None:
        if household.announced:
            scheduler.prepare(Lane.VOICE)
            await asyncio.sleep(rng.uniform(0.3, 1.5))
        prompt = (
            ASSIST_TOKENS + rng.randint(20, 80)
            if household.assist_prompt
            else rng.randint(60, 250)
        )
        await call(
            Lane.VOICE,
            f"satellite.{rng.randint(1, 3)}",
            prompt,
            rng.randint(10, 40),
            assist=household.assist_prompt,
        )

    async def automation() -> None:
        requester = rng.choice(["automation.quota", "automation.lights"])
        await call(
            Lane.AUTOMATION, requester, rng.randint(100, 600), rng.randint(20, 120)
        )

    async def sample() -> None:
        while loop.time() < end or scheduler._tickets:
            waiting = frozenset(
                (t.queued.lane.key, t.queued.requester)
                for t in scheduler._tickets.values()
                if t.queued.waiting
            )
            evening.samples.append((loop.time(), waiting))
            voice_since = min(
                (
                    t.queued.enqueued_at
                    for t in scheduler._tickets.values()
                    if t.queued.waiting and t.queued.lane.urgent
                ),
                default=None,
            )
            if voice_since is not None and loop.time() - voice_since > VOICE_WAIT_S:
                running = [
                    t.queued.lane.key
                    for t in scheduler._tickets.values()
                    if t.queued.running
                ]
                foreground = sum(
                    1
                    for t in scheduler._tickets.values()
                    if t.queued.running and t.queued.lane.foreground
                )
                if foreground < settings.headroom:
                    evening.lockouts.append(
                        f"at {loop.time():.2f} s voice waited "
                        f"{loop.time() - voice_since:.2f} s beside {running}"
                    )
            await asyncio.sleep(SAMPLE_S)

    clients = [
        closed_loop(Lane.INTERACTIVE, f"user.{index}", household.chat_prompt, (20, 200))
        for index in range(household.chats)
        for _ in range(household.chat_depth)
    ]
    clients += [
        closed_loop(
            Lane.BACKGROUND,
            f"job.{index % 2}",
            household.summary_prompt,
            household.summary_answer,
        )
        for index in range(household.summaries)
    ]
    sampler = asyncio.create_task(sample())
    with spy:
        async with asyncio.timeout(household.duration_s * 20):
            await asyncio.gather(
                *clients,
                arrivals(household.voice_per_s, household.voice_bursts, voice),
                arrivals(household.automations_per_s, False, automation),
            )
    await sampler
    await scheduler.close()

    # Service as the server gave it: each request's prompt once (when its answer began), each
    # token as it streamed.
    first: set[str] = set()
    lane_of_rank = {lane.rank: lane for lane in LANES}
    for at, request, _ in backend.served:
        lane = lane_of_rank[request.priority or 0].key  # the lane it ran in
        who = str(request.options["who"])
        key = str(request.options["key"])
        if key not in first:
            first.add(key)
            evening.served.append(
                (
                    at,
                    lane,
                    who,
                    settings.input_weight * int(request.options["prompt_tokens"]),
                )
            )
        evening.served.append((at, lane, who, settings.output_weight))
    # Nothing is left at the server, nothing held in the scheduler.
    state = scheduler._state
    assert backend.in_flight == {}
    assert backend.engine.running == [] and not backend.engine.waiting
    assert state.started_total == state.released_total
    assert (state.in_flight, state.prompt_in_flight, state.prefill_in_flight) == (
        0,
        0,
        0,
    )
    assert state.waiting == 0 and scheduler._tickets == {}
    table = scheduler._slots.table
    assert table is None or table.holder_count() == 0
    return evening


def _run(household: Household) -> Evening:
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(_evening(household))


# --- the promises ---------------------------------------------------------------------------------

MAX_PREEMPTIONS = SchedulerSettings().max_preemptions


def _ends_once(evening: Evening) -> None:
    assert len(evening.finished) == evening.submitted
    assert len({record.request_id for record in evening.finished}) == evening.submitted


def _share(evening: Evening) -> list[str]:
    """Windows in which background waited throughout and got less than its share."""
    settings = evening.settings
    window = settings.share_window_s
    samples = evening.samples
    served = sorted(evening.served)
    times = [t for t, *_ in served]
    background = [0.0]
    total = [0.0]
    for _, lane, _, weight in served:
        background.append(background[-1] + (weight if lane == "background" else 0.0))
        total.append(total[-1] + weight)
    broken: list[str] = []
    first_bad = -1  # the last sample without background waiting
    start = 0
    for index, (t, waiting) in enumerate(samples):
        if not any(lane == "background" for lane, _ in waiting):
            first_bad = index
        while samples[start][0] <= t - window:
            start += 1
        if t - window < samples[0][0] or first_bad >= start - 1:
            continue
        low = _bisect(times, t - window)
        high = _bisect(times, t)
        got = background[high] - background[low]
        all_ = total[high] - total[low]
        if got < settings.background_share * all_ - evening.largest_cost:
            broken.append(
                f"window ending {t:.1f} s: background {got:.0f} of {all_:.0f}"
            )
    return broken


def _bisect(times: list[float], at: float) -> int:
    low, high = 0, len(times)
    while low < high:
        mid = (low + high) // 2
        if times[mid] <= at:
            low = mid + 1
        else:
            high = mid
    return low


def _progress(evening: Evening) -> list[str]:
    """Preemptions past the bound; aged requests passed by later arrivals of other lanes."""
    settings = evening.settings
    broken = [
        f"{record.request_id} ({record.lane.key}) preempted {record.preemptions} times"
        for record in evening.finished
        if record.preemptions > MAX_PREEMPTIONS
    ]
    aging_s = settings.aging_s
    place = {lane: index for index, lane in enumerate(LANES)}
    best = sum(1 for lane in LANES if lane.urgent)
    share_rank = best - 0.5
    for at, admitted, rank, waiting in evening.admissions:
        if admitted.lane.urgent or rank == share_rank or admitted.resumed:
            continue
        oldest: dict[Lane, QueuedRequest] = {}
        for request in waiting:
            if request.resumed or request.lane.urgent or request.lane.yields:
                continue
            known = oldest.get(request.lane)
            if known is None or (request.enqueued_at, request.seq) < (
                known.enqueued_at,
                known.seq,
            ):
                oldest[request.lane] = request
        for lane, request in oldest.items():
            if lane is admitted.lane:
                continue
            steps = math.floor((at - request.enqueued_at) / aging_s) if aging_s else 0
            aged = max(best, place[lane] - steps)
            if (aged, request.enqueued_at) < (rank, admitted.enqueued_at):
                broken.append(
                    f"at {at:.2f} s {admitted.lane.key} #{admitted.seq} (rank {rank}) went "
                    f"before {lane.key} #{request.seq}, waiting since "
                    f"{request.enqueued_at:.2f} s (rank {aged})"
                )
    return broken


def _fairness(evening: Evening) -> list[str]:
    """Two requesters of one lane, both waiting throughout, served further apart than VTC's bound."""
    settings = evening.settings
    bound = 2 * max(
        settings.input_weight * evening.longest_prompt,
        settings.output_weight * settings.max_sequences * evening.largest_request,
    )
    by_pair: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for t, lane, who, weight in sorted(evening.served):
        by_pair[lane, who].append((t, weight))
    pairs: dict[str, set[str]] = defaultdict(set)
    for _, waiting in evening.samples:
        for lane, who in waiting:
            pairs[lane].add(who)
    broken: list[str] = []
    for lane, requesters in pairs.items():
        names = sorted(requesters)
        for index, a in enumerate(names):
            for b in names[index + 1 :]:
                for begin, end in _both_waiting(evening.samples, lane, a, b):
                    events = sorted(
                        [(t, w) for t, w in by_pair[lane, a] if begin <= t <= end]
                        + [(t, -w) for t, w in by_pair[lane, b] if begin <= t <= end]
                    )
                    difference = low = high = 0.0
                    for _, weight in events:
                        difference += weight
                        low, high = min(low, difference), max(high, difference)
                    if high - low > bound:
                        broken.append(
                            f"{lane}: {a} and {b} apart by {high - low:.0f} > {bound:.0f} "
                            f"between {begin:.1f} and {end:.1f} s"
                        )
    return broken


def _both_waiting(
    samples: list[tuple[float, frozenset[tuple[str, str]]]], lane: str, a: str, b: str
) -> list[tuple[float, float]]:
    intervals: list[tuple[float, float]] = []
    begin: float | None = None
    last = 0.0
    for t, waiting in samples:
        both = (lane, a) in waiting and (lane, b) in waiting
        if both and begin is None:
            begin = t
        elif not both and begin is not None:
            intervals.append((begin, last))
            begin = None
        last = t
    if begin is not None:
        intervals.append((begin, last))
    return intervals


def _quotas(evening: Evening) -> list[str]:
    """Return the requesters served more than their quota and one request in their own lane."""
    broken: list[str] = []
    for requester, quota in evening.settings.requester_quotas.items():
        records = [
            r
            for r in evening.finished
            if r.requester == requester and r.lane is Lane.AUTOMATION
        ]
        served = sum(r.prompt_tokens + r.output_tokens for r in records)
        one = max((r.prompt_tokens + r.output_tokens for r in records), default=0)
        if served > quota + one:
            broken.append(f"{requester}: {served} tokens in its lane, quota {quota}")
    return broken


def _promises(household: Household) -> None:
    evening = _run(household)
    _ends_once(evening)
    broken = {
        "share": _share(evening),
        "progress": _progress(evening),
        "fairness": _fairness(evening),
        "quotas": _quotas(evening),
        "voice": evening.lockouts,
    }
    assert not any(broken.values()), {k: v[:5] for k, v in broken.items() if v}


@EXAMPLES
@example(household=ITEM_1)
@example(household=ITEM_2)
@given(household=households)
def test_every_promise_holds_together(household: Household) -> None:
    """On a generated evening, every promise of the module docstring holds at once."""
    _promises(household)


@pytest.mark.parametrize(
    "host_cache", [True, False], ids=["host-cache", "no-host-cache"]
)
@pytest.mark.parametrize("costs", ["gpu", "gpu-fa-off", "cpu"])
@pytest.mark.parametrize("evening", [ITEM_1, ITEM_2], ids=["item-1", "item-2"])
def test_every_promise_holds_on_the_servers_own_costs(
    evening: Household, costs: str, host_cache: bool
) -> None:
    """The project's two evenings on each fitted profile, its host prompt cache on and off."""
    _promises(replace(evening, costs=costs, host_cache=host_cache))
