"""The decision of what runs next, tested directly on the policies and the run state."""

from __future__ import annotations

from dataclasses import replace

import pytest

from custom_components.llm_lanes.core.foreground import Foreground
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.policy import (
    Admit,
    Decision,
    FifoPolicy,
    LanesPolicy,
    Preempt,
    create_policy,
)
from custom_components.llm_lanes.core.run_state import (
    QueuedRequest,
    RunState,
    ShareLedger,
)
from custom_components.llm_lanes.core.settings import Policy, SchedulerSettings
from custom_components.llm_lanes.core.slots import SlotPlacer

from .fakes import FakeBackend, FakeClock


class Queue(RunState):
    """A run state that asks the policy its settings name, as the scheduler does."""

    def __init__(self, settings: SchedulerSettings) -> None:
        """Start empty, knowing nothing of the foreground."""
        super().__init__(settings)
        self.foreground = Foreground(settings.max_sequences)

    def choose(self, now: float) -> Decision:
        """Return the policy's decision on this state."""
        return create_policy(self.settings.policy).choose(self, self.foreground, now)


def entry(
    seq: int, lane: Lane, requester: str = "a", prompt: int = 10, at: float = 0.0
) -> QueuedRequest:
    """Build a queued request."""
    return QueuedRequest(
        seq=seq, lane=lane, requester=requester, prompt_tokens=prompt, enqueued_at=at
    )


def admit_all(queue: Queue, now: float = 0.0) -> list[int]:
    """Admit and immediately release until the queue is empty; return the order."""
    order = []
    while (decision := queue.choose(now)) is not None:
        assert isinstance(decision, Admit)
        queue.start(decision.request)
        queue.release(decision.request)
        order.append(decision.request.seq)
    return order


def test_fifo_policy_ignores_lanes() -> None:
    """Under fifo, arrival order wins over lanes."""
    queue = Queue(SchedulerSettings(policy=Policy.FIFO))
    for seq, lane in enumerate([Lane.BACKGROUND, Lane.VOICE, Lane.AUTOMATION], start=1):
        queue.push(entry(seq, lane))
    assert admit_all(queue) == [1, 2, 3]


def test_lanes_policy_orders_by_lane() -> None:
    """Under lanes (no share, no aging), voice first, background last."""
    queue = Queue(SchedulerSettings(background_share=0, aging_s=0))
    for seq, lane in enumerate([Lane.BACKGROUND, Lane.AUTOMATION, Lane.VOICE], start=1):
        queue.push(entry(seq, lane))
    assert admit_all(queue) == [3, 2, 1]


def test_vtc_lift_gives_no_credit_for_idling() -> None:
    """A requester returning after idling starts at the backlog's smallest counter, not at zero."""
    queue = Queue(SchedulerSettings())
    counters = queue.counters.lane(Lane.AUTOMATION)
    queue.push(entry(1, Lane.AUTOMATION, "busy"))
    counters["busy"] = 500.0
    queue.push(entry(2, Lane.AUTOMATION, "idle"))
    assert counters["idle"] == 500.0
    assert queue.counters.total("idle") == 500.0


def test_voice_preempts_least_advanced_background_only() -> None:
    """With every slot taken, voice preempts the background stream with the least output."""
    queue = Queue(SchedulerSettings(max_sequences=3, headroom=0, background_share=0))
    running = [
        entry(1, Lane.BACKGROUND),
        entry(2, Lane.BACKGROUND),
        entry(3, Lane.INTERACTIVE),
    ]
    for item in running:
        queue.push(item)
        queue.start(item)
    running[0].output_tokens = 50
    running[1].output_tokens = 5
    running[2].output_tokens = 0
    queue.push(entry(4, Lane.VOICE))
    assert queue.choose(0.0) == Preempt(running[1])
    queue.update_settings(
        SchedulerSettings(max_sequences=3, headroom=0, preemption=False)
    )
    assert queue.choose(0.0) is None
    queue.push(entry(5, Lane.INTERACTIVE))
    queue.release(running[0])
    # A slot is free now: voice is admitted before interactive, nothing is preempted.
    decision = queue.choose(0.0)
    assert isinstance(decision, Admit)
    assert decision.request.seq == 4


def test_voice_does_not_preempt_when_it_would_not_fit_anyway() -> None:
    """Blocked by the prefill budget that interactive holds, voice preempts nothing."""
    queue = Queue(SchedulerSettings(max_sequences=4, prefill_budget=100, headroom=0))
    for item in (
        entry(1, Lane.INTERACTIVE, prompt=90),
        entry(2, Lane.BACKGROUND, prompt=5),
    ):
        queue.push(item)
        queue.start(item)
    queue.push(entry(3, Lane.VOICE, prompt=50))
    assert queue.choose(0.0) is None


def test_voice_preempts_background_still_in_prefill() -> None:
    """Voice arriving while a long background prompt is in prefill preempts it, even with a free slot."""
    queue = Queue(
        SchedulerSettings(max_sequences=4, headroom=1, background_share=0).with_lane(
            Lane.BACKGROUND, max_concurrency=4
        )
    )
    streaming = entry(1, Lane.BACKGROUND, "job1", prompt=1200)
    long_prefill = entry(2, Lane.BACKGROUND, "job2", prompt=1300)
    short_prefill = entry(3, Lane.BACKGROUND, "job3", prompt=100)
    for item in (streaming, long_prefill, short_prefill):
        queue.push(item)
        queue.start(item)
    streaming.prefilling = False
    streaming.output_tokens = 3
    queue.push(entry(4, Lane.VOICE, "v", prompt=150))
    # Only the long prompt still in prefill makes way; the short one costs voice little.
    assert queue.choose(0.0) == Preempt(long_prefill)
    queue.release(long_prefill)
    queue.requeue_front(long_prefill, 0.0)
    decision = queue.choose(0.0)
    assert isinstance(decision, Admit)
    assert decision.request.seq == 4
    queue.start(decision.request)
    # While voice streams, the preempted request waits behind the prefill guard.
    assert queue.choose(0.0) is None
    queue.release(decision.request)
    decision = queue.choose(0.0)
    assert isinstance(decision, Admit)
    assert decision.request is long_prefill


def test_no_prefill_preemption_without_preemption() -> None:
    """With preemption off, a background prompt in prefill keeps its slot."""
    queue = Queue(
        SchedulerSettings(
            max_sequences=4, headroom=1, preemption=False, background_share=0
        )
    )
    running = entry(1, Lane.BACKGROUND, prompt=1200)
    queue.push(running)
    queue.start(running)
    queue.push(entry(2, Lane.VOICE, "v", prompt=150))
    decision = queue.choose(0.0)
    assert isinstance(decision, Admit)
    assert decision.request.seq == 2


def test_background_with_voice_cap() -> None:
    """While voice is active, background beyond its cap is preempted, least advanced first."""
    queue = Queue(
        SchedulerSettings(
            max_sequences=4, headroom=0, background_share=0, background_with_voice=1
        ).with_lane(Lane.BACKGROUND, max_concurrency=4)
    )
    running = [
        entry(seq, Lane.BACKGROUND, f"job{seq}", prompt=100) for seq in (1, 2, 3)
    ]
    for item, done in zip(running, (40, 5, 20), strict=True):
        queue.push(item)
        queue.start(item)
        item.prefilling = False
        item.output_tokens = done
    voice = entry(4, Lane.VOICE, "v", prompt=150)
    queue.push(voice)
    assert queue.choose(0.0) == Preempt(running[1])
    queue.release(running[1])
    queue.requeue_front(running[1], 0.0)
    assert queue.choose(0.0) == Preempt(running[2])
    queue.release(running[2])
    queue.requeue_front(running[2], 0.0)
    decision = queue.choose(0.0)
    assert decision == Admit(voice)
    queue.start(voice)
    # Slots are free, but background stays at its cap while voice streams.
    assert queue.choose(0.0) is None
    queue.release(voice)
    assert admit_all(queue) == [2, 3]


def test_expiry_uses_the_tighter_of_lane_wait_and_deadline() -> None:
    """A caller's deadline shortens the wait; settings changes recompute it."""
    settings = SchedulerSettings().with_lane(Lane.AUTOMATION, max_wait_s=10.0)
    queue = Queue(settings)
    first = entry(1, Lane.AUTOMATION)
    second = QueuedRequest(
        seq=2,
        lane=Lane.AUTOMATION,
        requester="b",
        prompt_tokens=1,
        enqueued_at=0.0,
        deadline_s=2,
    )
    queue.push(first)
    queue.push(second)
    assert queue.next_expiry() == 2.0
    assert queue.pop_expired(2.0) == [second]
    queue.update_settings(settings.with_lane(Lane.AUTOMATION, max_wait_s=4.0))
    assert queue.next_expiry() == 4.0
    assert queue.pop_expired(4.0) == [first]
    assert queue.waiting == 0


def test_share_ledger_window() -> None:
    """Background falls behind its share only when others were served in the window."""
    ledger = ShareLedger(10.0)
    assert not ledger.background_behind(0.0, 0.1)
    ledger.add(0.0, 100.0, background=False)
    assert ledger.background_behind(1.0, 0.1)
    ledger.add(1.0, 20.0, background=True)
    assert not ledger.background_behind(2.0, 0.1)
    assert ledger.shares(30.0) == (0.0, 0.0)


def test_lazy_structures_stay_bounded() -> None:
    """Admitted requests do not pile up in the lazily cleaned queues and expiry heap."""
    queue = Queue(SchedulerSettings(max_sequences=1))
    for seq in range(1, 5001):
        queue.push(entry(seq, LANES[seq % 4], requester=f"u{seq % 7}", at=float(seq)))
        decision = queue.choose(float(seq))
        assert isinstance(decision, Admit)
        queue.start(decision.request)
        queue.release(decision.request)
    assert queue.waiting == 0
    assert len(queue._arrival_order) == 0
    assert len(queue._expiry) <= 64
    assert all(len(lane.arrivals) == 0 for lane in queue._lanes.values())
    assert queue.started_total == queue.released_total == 5000


@pytest.mark.parametrize(
    ("policy", "kind"), [(Policy.LANES, LanesPolicy), (Policy.FIFO, FifoPolicy)]
)
def test_factory_builds_the_policy_a_setting_names(
    policy: Policy, kind: type[object]
) -> None:
    """Every policy setting has its own decision-maker, and only that one."""
    assert set(Policy) == {Policy.LANES, Policy.FIFO}
    assert type(create_policy(policy)) is kind


@pytest.mark.parametrize("policy", list(Policy))
def test_every_policy_keeps_the_shared_capacity(policy: Policy) -> None:
    """Both policies stop at max sequences and the prefill budget; a larger request runs alone."""
    settings = SchedulerSettings(max_sequences=2, prefill_budget=100, headroom=0)
    queue = Queue(replace(settings, policy=policy))
    huge = entry(1, Lane.INTERACTIVE, prompt=500)
    small = entry(2, Lane.INTERACTIVE, "b", prompt=10)
    queue.push(huge)
    queue.push(small)
    assert queue.choose(0.0) == Admit(huge)
    queue.start(huge)
    # The budget is spent by the oversized request: nothing else joins it.
    assert queue.choose(0.0) is None
    queue.release(huge)
    assert queue.choose(0.0) == Admit(small)
    queue.start(small)
    third, fourth = (
        entry(seq, Lane.INTERACTIVE, f"r{seq}", prompt=10) for seq in (3, 4)
    )
    queue.push(third)
    queue.push(fourth)
    assert queue.choose(0.0) == Admit(third)
    queue.start(third)
    # Two sequences in flight: the third waits, whatever the policy.
    assert queue.choose(0.0) is None


def test_switching_policy_reorders_the_waiting_requests() -> None:
    """The same waiting requests go in lane order under lanes and arrival order under fifo."""
    lanes = SchedulerSettings(background_share=0, aging_s=0)
    queue = Queue(lanes)
    for seq, lane in enumerate([Lane.BACKGROUND, Lane.AUTOMATION, Lane.VOICE], start=1):
        queue.push(entry(seq, lane, f"r{seq}"))
    decision = queue.choose(0.0)
    assert isinstance(decision, Admit)
    assert decision.request.seq == 3
    queue.update_settings(replace(lanes, policy=Policy.FIFO))
    assert admit_all(queue) == [1, 2, 3]


def test_background_borrows_headroom_only_while_the_foreground_is_idle() -> None:
    """With preemption on, background takes the last slot while no voice or chat is active."""
    settings = SchedulerSettings(max_sequences=2, headroom=1, background_share=0)
    queue = Queue(settings)
    first, second = entry(1, Lane.BACKGROUND, "j1"), entry(2, Lane.BACKGROUND, "j2")
    for item in (first, second):
        queue.push(item)
    assert queue.choose(0.0) == Admit(first)
    queue.start(first)
    assert queue.choose(0.0) == Admit(second)  # the headroom slot, lent
    queue.start(second)
    # Voice comes: the borrowed slot is taken back by preemption.
    queue.push(entry(3, Lane.VOICE, "v"))
    assert queue.choose(0.0) == Preempt(second)


def test_headroom_is_not_lent_while_the_foreground_is_active_or_without_preemption() -> (
    None
):
    """An interactive request streaming, or preemption off: background leaves the headroom."""
    for settings, foreground in (
        (SchedulerSettings(max_sequences=3, headroom=1, background_share=0), True),
        (
            SchedulerSettings(
                max_sequences=2, headroom=1, background_share=0, preemption=False
            ),
            False,
        ),
    ):
        queue = Queue(settings)
        if foreground:
            chat = entry(9, Lane.INTERACTIVE, "u")
            queue.push(chat)
            queue.start(chat)
        running = entry(1, Lane.BACKGROUND, "j1")
        queue.push(running)
        queue.start(running)
        queue.push(entry(2, Lane.BACKGROUND, "j2"))
        assert queue.choose(0.0) is None
    # Automation never borrows: nothing takes its slot back.
    queue = Queue(SchedulerSettings(max_sequences=2, headroom=1))
    running = entry(1, Lane.AUTOMATION, "a")
    queue.push(running)
    queue.start(running)
    queue.push(entry(2, Lane.AUTOMATION, "b"))
    assert queue.choose(0.0) is None


def test_automation_takes_back_a_slot_background_borrowed() -> None:
    """Background in every slot (the headroom borrowed): automation gets one, with no loop."""
    queue = Queue(SchedulerSettings(max_sequences=3, headroom=1, background_share=0))
    jobs = [entry(seq, Lane.BACKGROUND, f"j{seq}") for seq in (1, 2, 3)]
    for job in jobs:
        queue.push(job)
    for _ in jobs:
        decision = queue.choose(0.0)
        assert isinstance(decision, Admit)
        queue.start(decision.request, decision.rank)
    for job, done in zip(jobs, (30, 10, 20), strict=True):
        job.prefilling = False
        job.output_tokens = done
    queue.push(entry(4, Lane.AUTOMATION, "a"))
    decisions = []
    for _ in range(10):
        decision = queue.choose(0.0)
        if decision is None:
            break
        decisions.append(decision)
        if isinstance(decision, Preempt):
            queue.release(decision.victim)
            queue.requeue_front(decision.victim, 0.0)
        else:
            queue.start(decision.request, decision.rank)
    # Two background streams make way (the slot freed first is headroom), then automation runs;
    # the preempted ones do not take the headroom back while automation waited.
    assert decisions[:3] == [
        Preempt(jobs[1]),
        Preempt(jobs[2]),
        Admit(queue.running[4]),
    ]
    assert len(decisions) <= 4


@pytest.mark.parametrize("owed", [False, True])
def test_background_that_can_no_longer_be_preempted_leaves_the_headroom(
    owed: bool,
) -> None:
    """A background request preempted ``max_preemptions`` times never takes the headroom.

    Owed its share or not: voice could not take that slot back, and would wait for the stream
    to end (seconds) with every slot held by background it may not preempt.
    """
    settings = SchedulerSettings(
        max_sequences=2, headroom=1, background_share=0.5 if owed else 0.0
    )
    queue = Queue(settings)
    first = entry(1, Lane.BACKGROUND, "j1")
    queue.push(first)
    queue.start(first)
    immune = entry(2, Lane.BACKGROUND, "j2")
    immune.preemptions = settings.max_preemptions
    queue.push(immune)
    assert queue.choose(0.0) is None
    # Once the other slot frees, it runs there: the share and progress keep their due.
    queue.release(first)
    assert queue.choose(0.0) == Admit(immune)


def test_a_server_slow_to_free_a_cancelled_slot_keeps_its_prefilling_background() -> (
    None
):
    """Preempting to lighten the batch beside voice pays only where cancelling is quick.

    A llama-server notices a closed stream at its next token write or within a second, the
    stream decoding on meanwhile: where the scheduler measured that (``cancels_quickly``), the
    long prompt in prefill is left to run rather than cancelled for nothing.
    """
    settings = SchedulerSettings(
        max_sequences=4, headroom=1, background_share=0, server_slots=4
    ).with_lane(Lane.BACKGROUND, max_concurrency=4)
    decisions = []
    for latency_s in (0.02, 0.5, None):
        queue = Queue(settings)
        queue.foreground = _placing_foreground(settings, latency_s)
        long_prefill = entry(1, Lane.BACKGROUND, "job", prompt=1300)
        queue.push(long_prefill)
        queue.start(long_prefill)
        queue.push(entry(2, Lane.VOICE, "v", prompt=150))
        decisions.append(queue.choose(0.0))
    quick, slow, unmeasured = decisions
    assert isinstance(quick, Preempt)
    assert isinstance(slow, Admit)
    assert slow.request.seq == 2
    # Not measured yet: taken as slow (a llama-server's way) until a cancellation is measured.
    assert isinstance(unmeasured, Admit)
    assert unmeasured.request.seq == 2


def test_where_cancelling_is_slow_voice_waits_for_a_running_chat_rather_than_preempt() -> (
    None
):
    """Every slot taken: a chat ends sooner than a slow server lets go of a cancelled stream.

    Where the server frees a cancelled slot within ``LEND_MAX_CANCEL_S`` voice preempts the
    least-advanced background stream; where it takes half a second voice waits for the chat's
    slot, and preempts only when nothing but background runs.
    """
    settings = SchedulerSettings(
        max_sequences=3, headroom=0, background_share=0, server_slots=3
    )
    decisions = []
    for latency_s, chat_running in (
        (0.02, True),
        (0.5, True),
        (0.5, False),
        (None, True),
    ):
        queue = Queue(settings)
        queue.foreground = _placing_foreground(settings, latency_s)
        third = Lane.INTERACTIVE if chat_running else Lane.BACKGROUND
        for seq, lane in enumerate((Lane.BACKGROUND, Lane.BACKGROUND, third), 1):
            item = entry(seq, lane, f"r{seq}")
            queue.push(item)
            queue.start(item)
        queue.push(entry(4, Lane.VOICE, "v"))
        decisions.append(queue.choose(0.0))
    quick, slow_beside_a_chat, slow_background_only, unmeasured = decisions
    assert isinstance(quick, Preempt)
    assert slow_beside_a_chat is None
    assert isinstance(slow_background_only, Preempt)
    assert unmeasured is None


def test_a_server_whose_slots_are_not_placed_is_taken_as_quick() -> None:
    """Without slot placement nothing is waited for nor measured: voice preempts as it always did."""
    settings = SchedulerSettings(
        max_sequences=3, headroom=0, background_share=0, server_slots=3
    )
    for backend_places, placement in ((False, True), (True, False)):
        queue = Queue(settings.with_values({"slot_placement": str(placement).lower()}))
        placer = SlotPlacer(FakeBackend(FakeClock(), chooses_slots=backend_places))
        placer.resize(queue.settings, 0)
        assert placer.table is None
        queue.foreground = Foreground(settings.max_sequences, placer)
        for seq, lane in enumerate(
            (Lane.BACKGROUND, Lane.BACKGROUND, Lane.INTERACTIVE), 1
        ):
            item = entry(seq, lane, f"r{seq}")
            queue.push(item)
            queue.start(item)
        queue.push(entry(4, Lane.VOICE, "v"))
        assert isinstance(queue.choose(0.0), Preempt)


def _placing_foreground(
    settings: SchedulerSettings, latency_s: float | None
) -> Foreground:
    """Build a foreground that places slots, a cancellation measured (None: none yet)."""
    placer = SlotPlacer(FakeBackend(FakeClock(), chooses_slots=True))
    placer.resize(settings, 0)
    assert placer.table is not None
    if latency_s is not None:
        placer._latencies.append(latency_s)
    return Foreground(settings.max_sequences, placer)
