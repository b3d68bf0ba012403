"""Scheduler behaviour on a fake clock and a fake server: ordering, limits, preemption, cleanup."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from custom_components.llm_lanes.core.errors import (
    BackendHTTPError,
    LimitExceededError,
    QueueFullError,
    QueueTimeoutError,
    QuotaExceededError,
    SchedulerClosedError,
)
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import (
    Policy,
    QuotaAction,
    SchedulerSettings,
)
from custom_components.llm_lanes.core.snapshot import FinishedRequest, GenerateResult

from .fakes import FakeBackend, FakeClock, chat, expected_text, served_tags, settle


def make(
    settings: SchedulerSettings | None = None, **backend_args: float
) -> tuple[Scheduler, FakeBackend, FakeClock, list[FinishedRequest]]:
    """Build a scheduler over a fake server, with a list that collects finished requests."""
    clock = FakeClock()
    backend = FakeBackend(clock, **backend_args)
    scheduler = Scheduler(backend, settings or SchedulerSettings(), clock=clock)
    finished: list[FinishedRequest] = []
    scheduler.add_listener(finished.append)
    return scheduler, backend, clock, finished


def spawn(
    scheduler: Scheduler,
    request: ChatRequest,
    lane: Lane,
    requester: str,
    *,
    prompt_tokens: int | None = None,
) -> asyncio.Task[GenerateResult]:
    """Run ``generate`` in a task of its own (a caller that waits its turn)."""
    return asyncio.create_task(
        scheduler.generate(
            request, lane=lane, requester=requester, prompt_tokens=prompt_tokens
        )
    )


async def collect(stream: AsyncGenerator[StreamChunk]) -> str:
    """Read a stream to its end and return its text."""
    return "".join([chunk.text async for chunk in stream])


async def test_generate_sets_priority_and_default_max_tokens() -> None:
    """A voice request runs with the lane's priority and default output tokens."""
    scheduler, backend, _, finished = make()
    result = await scheduler.generate(
        chat(answer_tokens=4, prompt_tokens=30), lane=Lane.VOICE, requester="alice"
    )
    assert result.text == expected_text(4)
    assert result.finish_reason == "stop"
    assert result.usage.output_tokens == 4
    assert result.usage.prompt_tokens == 30
    assert result.usage.source == "server"
    sent = backend.streams[0].request
    assert sent.priority == Lane.VOICE.rank == 0
    assert (
        sent.max_tokens == SchedulerSettings().lanes[Lane.VOICE].default_output_tokens
    )
    assert [record.outcome for record in finished] == ["ok"]
    assert result.finished is finished[0]
    assert finished[0].output_tokens == 4
    assert finished[0].token_source == "server"
    assert finished[0].ttft_s == pytest.approx(0.01)
    assert finished[0].itl_p95_s == pytest.approx(0.01)


async def test_limits_are_checked_before_anything_is_sent() -> None:
    """Breaking a lane limit raises a typed error naming the limit; the server sees nothing."""
    scheduler, backend, _, finished = make()
    with pytest.raises(LimitExceededError) as err:
        await scheduler.generate(chat(max_tokens=5000), lane=Lane.VOICE, requester="a")
    assert (err.value.lane, err.value.limit, err.value.value, err.value.maximum) == (
        "voice",
        "max_output_tokens",
        5000,
        1024,
    )
    with pytest.raises(LimitExceededError) as err:
        await scheduler.generate(
            chat(), lane=Lane.VOICE, requester="a", prompt_tokens=9000
        )
    assert err.value.limit == "max_prompt_tokens"
    assert "voice" in str(err.value)
    assert backend.streams == []
    assert [record.outcome for record in finished] == ["rejected", "rejected"]
    assert scheduler.snapshot().lanes[Lane.VOICE].rejected_total == 2


async def test_queue_full() -> None:
    """One request more than a lane's max queued is refused."""
    gate = asyncio.Event()
    settings = SchedulerSettings(max_sequences=1).with_lane(
        Lane.AUTOMATION, max_queued=2
    )
    scheduler, _, _, _ = make(settings)
    tasks = [spawn(scheduler, chat(gate=gate), Lane.AUTOMATION, "a") for _ in range(3)]
    await settle()
    with pytest.raises(QueueFullError):
        await scheduler.generate(chat(), lane=Lane.AUTOMATION, requester="a")
    gate.set()
    await asyncio.gather(*tasks)


async def test_strict_lane_priority() -> None:
    """With one slot (and no background share), requests run in lane order."""
    gate = asyncio.Event()
    scheduler, backend, _, _ = make(
        SchedulerSettings(max_sequences=1, headroom=0, background_share=0)
    )
    first = spawn(scheduler, chat(gate=gate, tag="first"), Lane.AUTOMATION, "x")
    await settle()
    tasks = [
        spawn(scheduler, chat(tag=lane.key), lane, lane.key) for lane in reversed(LANES)
    ]
    await settle()
    assert scheduler.snapshot().queue_depth == 4
    gate.set()
    await asyncio.gather(first, *tasks)
    assert served_tags(backend) == ["first", *(lane.key for lane in LANES)]


async def test_headroom_is_kept_for_voice_and_interactive() -> None:
    """Automation may not take the last slot; interactive may."""
    gate = asyncio.Event()
    settings = SchedulerSettings(max_sequences=2, headroom=1)
    scheduler, backend, _, _ = make(settings)
    tasks = [spawn(scheduler, chat(gate=gate), Lane.AUTOMATION, "a") for _ in range(2)]
    await settle()
    assert scheduler.snapshot().in_flight == 1
    tasks.append(spawn(scheduler, chat(gate=gate), Lane.INTERACTIVE, "b"))
    await settle()
    assert scheduler.snapshot().in_flight == 2
    assert len(backend.streams) == 2
    gate.set()
    await asyncio.gather(*tasks)


async def test_prefill_budget_and_oversized_request_runs_alone() -> None:
    """Prompt tokens in flight stay within the budget; a bigger request runs alone."""
    gate = asyncio.Event()
    settings = SchedulerSettings(max_sequences=4, prefill_budget=100, headroom=0)
    scheduler, backend, _, _ = make(settings)
    first = spawn(scheduler, chat(gate=gate), Lane.AUTOMATION, "a", prompt_tokens=60)
    second = spawn(scheduler, chat(gate=gate), Lane.AUTOMATION, "b", prompt_tokens=60)
    await settle()
    snap = scheduler.snapshot()
    assert (snap.in_flight, snap.prompt_tokens_in_flight, snap.queue_depth) == (
        1,
        60,
        1,
    )
    gate.set()
    await asyncio.gather(first, second)
    big = await scheduler.generate(
        chat(), lane=Lane.AUTOMATION, requester="a", prompt_tokens=500
    )
    assert big.finished.outcome == "ok"
    assert (
        backend.max_active == 2
    )  # the second started once the first one's prompt was done
    assert [stream.prompt_tokens for stream in backend.streams][-1] == 10


async def test_prefill_budget_bounds_prompts_in_prefill_only() -> None:
    """A request whose first token came no longer holds prefill budget: the next one starts."""
    gate = asyncio.Event()
    scheduler, backend, _, _ = make(
        SchedulerSettings(max_sequences=4, prefill_budget=100, headroom=0)
    )
    first = spawn(
        scheduler,
        chat(answer_tokens=50, gate=gate),
        Lane.AUTOMATION,
        "a",
        prompt_tokens=80,
    )
    second = spawn(
        scheduler, chat(answer_tokens=50), Lane.AUTOMATION, "b", prompt_tokens=80
    )
    await settle()
    assert len(backend.active) == 1  # both prompts at once would be 160 > 100
    gate.set()
    await asyncio.gather(first, second)
    assert backend.max_active == 2  # the second prefilled while the first decoded


async def test_lane_concurrency_cap() -> None:
    """A lane's concurrency cap holds however many slots are free."""
    gate = asyncio.Event()
    scheduler, _, _, _ = make(
        SchedulerSettings(max_sequences=8, headroom=0).with_lane(
            Lane.BACKGROUND, max_concurrency=2
        )
    )
    tasks = [
        spawn(scheduler, chat(gate=gate), Lane.BACKGROUND, "job") for _ in range(4)
    ]
    await settle()
    snap = scheduler.snapshot()
    assert snap.lanes[Lane.BACKGROUND].in_flight == 2
    assert snap.lanes[Lane.BACKGROUND].queue_depth == 2
    gate.set()
    await asyncio.gather(*tasks)


async def test_background_pause_holds_new_background_work() -> None:
    """Paused background admits nothing until resumed."""
    settings = SchedulerSettings(background_paused=True)
    scheduler, backend, _, _ = make(settings)
    task = spawn(scheduler, chat(), Lane.BACKGROUND, "job")
    await settle()
    assert backend.streams == []
    scheduler.update_settings(SchedulerSettings())
    result = await task
    assert result.finished.outcome == "ok"


@pytest.mark.parametrize(
    ("aging_s", "waited_s", "newcomer", "order"),
    [
        # Two aging periods lift background above newer interactive work.
        (10.0, 25.0, Lane.INTERACTIVE, ["first", "old", "new"]),
        # However long it waited, background never goes before voice.
        (1.0, 100.0, Lane.VOICE, ["first", "new", "old"]),
    ],
)
async def test_aging(
    aging_s: float, waited_s: float, newcomer: Lane, order: list[str]
) -> None:
    """A waiting background request climbs one lane per aging period, never above voice."""
    gate = asyncio.Event()
    settings = SchedulerSettings(
        max_sequences=1, headroom=0, aging_s=aging_s, background_share=0
    )
    scheduler, backend, clock, _ = make(settings)
    first = spawn(scheduler, chat(gate=gate, tag="first"), Lane.INTERACTIVE, "a")
    await settle()
    old = spawn(scheduler, chat(tag="old"), Lane.BACKGROUND, "job")
    await settle()
    clock.advance(waited_s)
    new = spawn(scheduler, chat(tag="new"), newcomer, "b")
    await settle()
    gate.set()
    await asyncio.gather(first, old, new)
    assert served_tags(backend) == order


async def test_vtc_serves_the_least_served_requester_first() -> None:
    """Backlogged together, a requester of long answers is served less often than a light one."""
    gate = asyncio.Event()
    scheduler, backend, _, _ = make(SchedulerSettings(max_sequences=1, headroom=0))
    blocker = spawn(scheduler, chat(gate=gate, tag="block"), Lane.AUTOMATION, "z")
    await settle()
    tasks = [
        spawn(scheduler, chat(answer_tokens=tokens, tag=tag), Lane.AUTOMATION, who)
        for who, tag, tokens in [
            ("heavy", "heavy1", 20),
            ("heavy", "heavy2", 20),
            ("light", "light1", 5),
            ("light", "light2", 5),
            ("light", "light3", 5),
        ]
    ]
    await settle()
    gate.set()
    await asyncio.gather(blocker, *tasks)
    # Counters (prompt 10, output weight 2): heavy +50 per request, light +20: light catches up
    # with heavy's one request only after three of its own.
    assert served_tags(backend) == [
        "block",
        "heavy1",
        "light1",
        "light2",
        "light3",
        "heavy2",
    ]


async def test_quota_demotes_or_rejects() -> None:
    """Over quota, a request runs in background (demote) or is refused (reject)."""
    settings = SchedulerSettings(quota_tokens_per_day=20)
    scheduler, _, _, _ = make(settings)
    await scheduler.generate(
        chat(answer_tokens=15), lane=Lane.VOICE, requester="kid", prompt_tokens=10
    )
    assert scheduler.snapshot().requesters["kid"].tokens_last_24h == 25
    demoted = await scheduler.generate(chat(), lane=Lane.VOICE, requester="kid")
    assert demoted.finished.lane is Lane.BACKGROUND
    other = await scheduler.generate(chat(), lane=Lane.VOICE, requester="adult")
    assert other.finished.lane is Lane.VOICE
    scheduler.update_settings(
        SchedulerSettings(quota_tokens_per_day=20, quota_action=QuotaAction.REJECT)
    )
    with pytest.raises(QuotaExceededError):
        await scheduler.generate(chat(), lane=Lane.VOICE, requester="kid")


async def test_prefill_guard_holds_long_background_prompts_while_voice_streams() -> (
    None
):
    """A long background prompt waits for the voice stream; a short one does not."""
    gate = asyncio.Event()
    # No share owed (background_share 0): owed its share, background would go past the guard.
    settings = SchedulerSettings(
        max_sequences=4, prefill_guard_tokens=100, headroom=0, background_share=0
    )
    scheduler, backend, _, _ = make(settings)
    voice = spawn(scheduler, chat(gate=gate), Lane.VOICE, "v")
    await settle()
    long_bg = spawn(scheduler, chat(), Lane.BACKGROUND, "job", prompt_tokens=500)
    await settle()
    assert len(backend.streams) == 1
    gate.set()
    await asyncio.gather(voice, long_bg)
    assert len(backend.streams) == 2


async def test_preemption_resumes_seamlessly() -> None:
    """Voice preempts the background stream; the background caller sees one stream, no repeats."""
    settings = SchedulerSettings(max_sequences=1, headroom=0)
    scheduler, backend, _, finished = make(settings)
    background = spawn(
        scheduler, chat(answer_tokens=30, tag="bg"), Lane.BACKGROUND, "job"
    )
    await settle(12)
    done_before = backend.streams[0].tokens_sent
    assert 0 < done_before < 30
    voice = await scheduler.generate(
        chat(answer_tokens=3, tag="voice"), lane=Lane.VOICE, requester="v"
    )
    result = await background
    assert voice.text == expected_text(3)
    assert result.text == expected_text(30)
    assert result.usage.output_tokens == 30
    first, second, third = backend.streams
    assert first.closed_early
    assert second.request.options["tag"] == "voice"
    assert third.request.assistant_prefix == expected_text(first.tokens_sent)
    assert third.request.max_tokens == 1024 - first.tokens_sent
    assert result.finished.preemptions == 1
    assert scheduler.snapshot().preemptions_total == 1
    assert [r.outcome for r in finished] == ["ok", "ok"]


async def test_voice_preempts_background_still_in_prefill() -> None:
    """A background prompt still in prefill makes way for voice, though a slot is free."""
    gate = asyncio.Event()
    scheduler, backend, _, finished = make(
        SchedulerSettings(max_sequences=2, headroom=1)
    )
    background = spawn(
        scheduler,
        chat(answer_tokens=6, prompt_tokens=2000, gate=gate, tag="bg"),
        Lane.BACKGROUND,
        "job",
        prompt_tokens=2000,
    )
    await settle()
    assert len(backend.active) == 1
    voice = await scheduler.generate(
        chat(answer_tokens=3, tag="voice"), lane=Lane.VOICE, requester="v"
    )
    assert voice.text == expected_text(3)
    first, second = backend.streams[:2]
    assert first.closed_early
    assert first.tokens_sent == 0
    assert second.request.options["tag"] == "voice"
    gate.set()
    result = await background
    assert result.text == expected_text(6)
    assert result.finished.preemptions == 1
    # Nothing was generated before the preemption, so the retry carries no prefix.
    assert backend.streams[2].request.assistant_prefix == ""
    assert [r.outcome for r in finished] == ["ok", "ok"]


async def test_no_preemption_when_turned_off_or_for_interactive() -> None:
    """With preemption off voice waits; interactive streams are never preempted."""
    scheduler, backend, _, _ = make(
        SchedulerSettings(max_sequences=1, headroom=0, preemption=False)
    )
    background = spawn(scheduler, chat(answer_tokens=30), Lane.BACKGROUND, "job")
    await settle(12)
    await scheduler.generate(chat(answer_tokens=3), lane=Lane.VOICE, requester="v")
    await background
    assert not backend.streams[0].closed_early

    scheduler, backend, _, _ = make(SchedulerSettings(max_sequences=1, headroom=0))
    interactive = spawn(scheduler, chat(answer_tokens=30), Lane.INTERACTIVE, "u")
    await settle(12)
    await scheduler.generate(chat(answer_tokens=3), lane=Lane.VOICE, requester="v")
    await interactive
    assert not backend.streams[0].closed_early


async def test_caller_that_gives_up_frees_its_place_and_slot() -> None:
    """Closing a waiting or a running stream frees the queue place or the slot at once."""
    gate = asyncio.Event()
    scheduler, backend, _, finished = make(
        SchedulerSettings(max_sequences=1, headroom=0)
    )
    running = scheduler.stream(chat(gate=gate), lane=Lane.AUTOMATION, requester="a")
    waiting = scheduler.stream(chat(), lane=Lane.AUTOMATION, requester="b")
    running_task = asyncio.create_task(anext(running))
    await settle()
    waiting_task = asyncio.create_task(anext(waiting))
    await settle()
    assert scheduler.snapshot().queue_depth == 1
    waiting_task.cancel()
    await settle()
    assert scheduler.snapshot().queue_depth == 0
    running_task.cancel()
    await settle()
    snap = scheduler.snapshot()
    assert (snap.in_flight, snap.prompt_tokens_in_flight) == (0, 0)
    assert backend.streams[0].closed_early
    assert backend.active == []
    assert [r.outcome for r in finished] == ["cancelled", "cancelled"]
    await running.aclose()
    await waiting.aclose()
    after = await scheduler.generate(chat(), lane=Lane.AUTOMATION, requester="c")
    assert after.finished.outcome == "ok"


async def test_server_error_reaches_caller_typed_and_frees_slot() -> None:
    """A backend error ends the request with that error; the next request runs."""
    scheduler, _, _, finished = make(SchedulerSettings(max_sequences=1))
    with pytest.raises(BackendHTTPError) as err:
        await scheduler.generate(chat(fail_after=2), lane=Lane.VOICE, requester="a")
    assert err.value.status == 500
    assert scheduler.snapshot().in_flight == 0
    ok = await scheduler.generate(chat(), lane=Lane.VOICE, requester="a")
    assert ok.finished.outcome == "ok"
    assert [(r.outcome, r.error) for r in finished] == [
        ("error", "BackendHTTPError"),
        ("ok", None),
    ]


async def test_queue_timeout_on_fake_clock() -> None:
    """A request that waits past its lane's max wait fails with QueueTimeoutError."""
    gate = asyncio.Event()
    settings = SchedulerSettings(max_sequences=1, headroom=0).with_lane(
        Lane.AUTOMATION, max_wait_s=5.0
    )
    scheduler, _, clock, finished = make(settings)
    blocker = spawn(scheduler, chat(gate=gate), Lane.AUTOMATION, "a")
    await settle()
    waiting = spawn(scheduler, chat(), Lane.AUTOMATION, "b")
    short = asyncio.create_task(
        scheduler.generate(chat(), lane=Lane.AUTOMATION, requester="c", deadline_s=1.0)
    )
    await settle()
    clock.advance(1.5)
    scheduler.tick()
    with pytest.raises(QueueTimeoutError):
        await short
    assert not waiting.done()
    clock.advance(4.0)
    scheduler.tick()
    with pytest.raises(QueueTimeoutError):
        await waiting
    gate.set()
    await blocker
    snap = scheduler.snapshot()
    assert snap.lanes[Lane.AUTOMATION].rejected_total == 2
    assert sorted(r.outcome for r in finished) == ["error", "error", "ok"]


async def test_close_fails_every_caller_and_leaks_nothing() -> None:
    """close() ends waiting and running requests with SchedulerClosedError and stops the pumps."""
    gate = asyncio.Event()
    scheduler, backend, _, finished = make(
        SchedulerSettings(max_sequences=1, headroom=0)
    )
    running = spawn(scheduler, chat(gate=gate), Lane.VOICE, "a")
    waiting = spawn(scheduler, chat(), Lane.AUTOMATION, "b")
    await settle()
    await scheduler.close()
    for task in (running, waiting):
        with pytest.raises(SchedulerClosedError):
            await task
    assert backend.active == []
    assert backend.streams[0].closed_early
    assert not scheduler._attempts.pumps
    assert len(finished) == 2
    with pytest.raises(SchedulerClosedError):
        await scheduler.generate(chat(), lane=Lane.VOICE, requester="a")


async def test_snapshot_reports_goodput_and_percentiles() -> None:
    """Finished requests show up in the window's percentiles, goodput and token totals."""
    settings = SchedulerSettings().with_lane(
        Lane.VOICE, ttft_slo_s=0.05, itl_slo_s=0.02
    )
    scheduler, backend, _, finished = make(settings)
    await scheduler.generate(chat(answer_tokens=5), lane=Lane.VOICE, requester="a")
    backend.prefill_s = 1.0
    await scheduler.generate(chat(answer_tokens=5), lane=Lane.VOICE, requester="b")
    assert [r.met_objectives for r in finished] == [True, False]
    snap = scheduler.snapshot()
    voice = snap.lanes[Lane.VOICE]
    assert voice.finished_total == 2
    assert voice.goodput == pytest.approx(0.5)
    assert snap.goodput == pytest.approx(0.5)
    assert voice.itl_p50_s == pytest.approx(0.01)
    assert voice.ttft_p50_s is not None and voice.ttft_p50_s > 0.01
    assert voice.output_tokens_total == 10
    assert snap.requesters["a"].output_tokens_total == 5
    assert snap.requesters["a"].virtual_counter == pytest.approx(10 + 2 * 5)
    assert snap.in_flight == 0


async def test_wait_limit_fires_on_its_own_timer_with_the_real_clock() -> None:
    """Without anyone calling tick, the scheduler's own timer times a waiting request out."""
    gate = asyncio.Event()
    clock = FakeClock()
    backend = FakeBackend(clock)
    scheduler = Scheduler(backend, SchedulerSettings(max_sequences=1, headroom=0))
    blocker = spawn(scheduler, chat(gate=gate), Lane.AUTOMATION, "a")
    await settle()
    with pytest.raises(QueueTimeoutError):
        await scheduler.generate(
            chat(), lane=Lane.AUTOMATION, requester="b", deadline_s=0.02
        )
    gate.set()
    await blocker
    assert scheduler._timer is None


async def test_snapshot_per_requester_and_background_share() -> None:
    """Requesters show their queue, tokens and quota; the share of background service is reported."""
    gate = asyncio.Event()
    settings = SchedulerSettings(
        max_sequences=1, headroom=0, requester_quotas={"kid": 5000}, preemption=False
    )
    scheduler, _, _, finished = make(settings)
    remove = scheduler.add_listener(lambda record: None)
    running = spawn(scheduler, chat(gate=gate, answer_tokens=3), Lane.BACKGROUND, "kid")
    waiting = spawn(scheduler, chat(answer_tokens=3), Lane.INTERACTIVE, "kid")
    await settle()
    kid = scheduler.snapshot().requesters["kid"]
    assert (kid.in_flight, kid.queue_depth, kid.quota_tokens) == (1, 1, 5000)
    gate.set()
    await asyncio.gather(running, waiting)
    remove()
    snap = scheduler.snapshot()
    kid = snap.requesters["kid"]
    assert kid.finished_total == 2
    assert kid.output_tokens_total == 6
    assert kid.tokens_last_24h == 2 * (10 + 3)
    # Both requests: 10 prompt + 2 * 3 output each, half of it background.
    assert snap.background_service_share == pytest.approx(0.5)
    assert snap.lanes[Lane.BACKGROUND].finished_total == 1
    assert len(finished) == 2


async def test_fifo_policy_serves_in_arrival_order() -> None:
    """Under the fifo policy lanes do not reorder anything."""
    gate = asyncio.Event()
    settings = SchedulerSettings(policy=Policy.FIFO, max_sequences=1)
    scheduler, backend, _, _ = make(settings)
    tasks = [
        spawn(scheduler, chat(gate=gate, tag=lane.key), lane, "a")
        for lane in reversed(LANES)
    ]
    await settle()
    gate.set()
    await asyncio.gather(*tasks)
    assert served_tags(backend) == [lane.key for lane in reversed(LANES)]
