"""A quota reserves what the server will charge a prompt: counted there, or bounded (fake clock).

The fake server charges 38 prompt tokens for a chat we estimate at 7 (its chat template, as a real
one adds a system prompt and role markers). Thirty requests arrive at once from a requester with
a 2,000-token quota; what its own lane serves stays within the quota and one request.
"""

from __future__ import annotations

import asyncio

import pytest

from custom_components.llm_lanes.core.errors import BackendHTTPError, QuotaExceededError
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatRequest, ToolSpec
from custom_components.llm_lanes.core.quota_prompts import (
    QuotaPrompt,
    QuotaPrompts,
    presumed_bound,
)
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import QuotaAction, SchedulerSettings
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens

from .fakes import FakeBackend, FakeClock, chat, settle

QUOTA = 2_000
BURST = 30
SERVER_PROMPT = 38
OUTPUT = 60
ONE_REQUEST = SERVER_PROMPT + OUTPUT


def make(
    *, counts: bool, action: QuotaAction = QuotaAction.DEMOTE
) -> tuple[Scheduler, FakeBackend, list[FinishedRequest]]:
    """Make a scheduler whose requester ``greedy`` has the quota, over a fake server."""
    clock = FakeClock()
    backend = FakeBackend(clock, counts_prompts=counts)
    scheduler = Scheduler(
        backend,
        SchedulerSettings(requester_quotas={"greedy": QUOTA}, quota_action=action),
        clock=clock,
    )
    finished: list[FinishedRequest] = []
    scheduler.add_listener(finished.append)
    return scheduler, backend, finished


def request(**how: object) -> ChatRequest:
    """Make a chat the server charges ``SERVER_PROMPT`` prompt tokens and answers in full."""
    return chat(
        prompt_tokens=SERVER_PROMPT,
        answer_tokens=OUTPUT,
        max_tokens=OUTPUT,
        **how,  # type: ignore[arg-type]
    )


async def burst(scheduler: Scheduler, count: int = BURST) -> list[str]:
    """Send ``count`` requests of ``greedy`` at once; return how each ended."""

    async def one() -> str:
        try:
            await scheduler.generate(
                request(), lane=Lane.INTERACTIVE, requester="greedy"
            )
        except QuotaExceededError:
            return "refused"
        return "served"

    return await asyncio.gather(*(one() for _ in range(count)))


def in_lane(finished: list[FinishedRequest]) -> list[FinishedRequest]:
    """Return the requests ``greedy`` was served in its own lane."""
    return [
        r
        for r in finished
        if r.requester == "greedy"
        and r.lane is Lane.INTERACTIVE
        and r.outcome != "rejected"
    ]


def served(records: list[FinishedRequest]) -> int:
    """Tokens the server charged for ``records``."""
    return sum(r.prompt_tokens + r.output_tokens for r in records)


def test_the_template_is_what_the_estimate_misses() -> None:
    """The scenario: our estimate is well below what the server charges."""
    assert estimate_prompt_tokens(request()) * 4 < SERVER_PROMPT


@pytest.mark.parametrize("action", [QuotaAction.DEMOTE, QuotaAction.REJECT])
async def test_a_counting_server_keeps_a_burst_within_the_quota(
    action: QuotaAction,
) -> None:
    """Counted exactly, the lane serves the quota's worth of requests, and one more at most."""
    scheduler, backend, finished = make(counts=True, action=action)
    outcomes = await burst(scheduler)
    lane = in_lane(finished)
    assert served(lane) <= QUOTA + ONE_REQUEST
    # Exact reservations: every request until the quota is reached runs in the lane.
    assert len(lane) == -(-QUOTA // ONE_REQUEST)
    assert len(backend.counted) == BURST
    assert {r.token_source for r in finished if r.outcome != "rejected"} == {"server"}
    if action is QuotaAction.DEMOTE:
        assert outcomes.count("served") == BURST
        assert all(r.lane is Lane.BACKGROUND for r in finished if r not in lane)
    else:
        assert outcomes.count("refused") == BURST - len(lane)
    assert scheduler.quotas.reserved("greedy") == 0


async def test_a_server_that_cannot_count_is_bounded_and_the_crossing_request_runs_alone() -> (
    None
):
    """Nothing known of the prompt: the presumed bound reserves; the last one runs alone."""
    scheduler, backend, finished = make(counts=False)
    await burst(scheduler)
    lane = in_lane(finished)
    assert served(lane) <= QUOTA + ONE_REQUEST
    reserving = presumed_bound(estimate_prompt_tokens(request())) + OUTPUT
    assert reserving > ONE_REQUEST
    assert len(lane) == QUOTA // reserving
    assert backend.counted == []


async def test_what_the_server_reported_bounds_the_next_prompts() -> None:
    """After one report, the burst reserves what the server charged, not the presumed bound."""
    scheduler, _, finished = make(counts=False)
    await burst(scheduler, 1)
    await burst(scheduler)
    lane = in_lane(finished)
    assert served(lane) <= QUOTA + ONE_REQUEST
    # The first alone, then every request whose reservation fits below the quota.
    assert len(lane) == 1 + (QUOTA - ONE_REQUEST) // ONE_REQUEST


async def test_a_failed_count_falls_back_to_the_bound() -> None:
    """A server whose count fails is bounded instead: the quota still holds."""
    scheduler, backend, finished = make(counts=True)
    backend.count_error = BackendHTTPError("boom", status=500)
    await burst(scheduler)
    lane = in_lane(finished)
    assert len(backend.counted) == BURST
    assert served(lane) <= QUOTA + ONE_REQUEST
    reserving = presumed_bound(estimate_prompt_tokens(request())) + OUTPUT
    assert len(lane) == QUOTA // reserving


async def test_requesters_without_a_quota_are_never_counted() -> None:
    """Voice and everyone without a quota reach the queue without a round trip."""
    scheduler, backend, _ = make(counts=True)
    await scheduler.generate(request(tag="voice"), lane=Lane.VOICE, requester="adult")
    await scheduler.generate(
        request(tag="greedy"), lane=Lane.INTERACTIVE, requester="greedy"
    )
    assert [r.options["tag"] for r in backend.counted] == ["greedy"]


async def test_a_failed_or_cancelled_request_gives_its_reservation_back() -> None:
    """What it held is released; it is charged the counted prompt and what streamed."""
    scheduler, backend, finished = make(counts=True)
    with pytest.raises(BackendHTTPError):
        await scheduler.generate(
            request(fail_after=2), lane=Lane.INTERACTIVE, requester="greedy"
        )
    assert scheduler.quotas.reserved("greedy") == 0
    gate = asyncio.Event()
    task = asyncio.create_task(
        scheduler.generate(
            request(gate=gate), lane=Lane.INTERACTIVE, requester="greedy"
        )
    )
    await settle()
    assert scheduler.quotas.reserved("greedy") == SERVER_PROMPT + OUTPUT
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle()
    assert scheduler.quotas.reserved("greedy") == 0
    assert [r.outcome for r in finished] == ["error", "cancelled"]
    # Neither reported its usage: each is charged the server's count of its prompt.
    charged = scheduler.quotas.used("greedy", backend.clock())
    assert charged == sum(SERVER_PROMPT + r.output_tokens for r in finished)


def test_a_report_bounds_shorter_prompts_by_itself_and_longer_ones_scaled() -> None:
    """A report (estimate e, charged r) bounds E <= e by r, E > e by r * E / e."""
    prompts = QuotaPrompts(FakeBackend(FakeClock()))
    plain = chat()
    assert prompts.bounded(plain, "kid", 10) == QuotaPrompt(
        presumed_bound(10), counted=False
    )
    prompts.learn(plain, "kid", 10, 40)
    assert prompts.bounded(plain, "kid", 5).tokens == 40
    assert prompts.bounded(plain, "kid", 25).tokens == 100
    # Another requester, or a prompt with tools, knows nothing of that report.
    assert prompts.bounded(plain, "adult", 10).tokens == presumed_bound(10)
    tools = ChatRequest(
        model="fake",
        messages=plain.messages,
        tools=(ToolSpec(name="HassTurnOn", description="", parameters={}),),
    )
    assert prompts.bounded(tools, "kid", 10).tokens == presumed_bound(10)
    # The most cautious of the recent reports wins (one can be low: a cached prompt).
    prompts.learn(plain, "kid", 10, 12)
    assert prompts.bounded(plain, "kid", 10).tokens == 40
