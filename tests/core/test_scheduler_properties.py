"""Property-based tests of the scheduler's invariants (hypothesis, fake clock, fake server).

Each example runs a whole workload on its own event loop; the fake server checks the admission
limits at every token, and moves the fake clock (and the scheduler's timers) as it streams.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings as hyp_settings, strategies as st

from custom_components.llm_lanes.core.errors import LanesError, QueueTimeoutError
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import Policy, SchedulerSettings
from custom_components.llm_lanes.core.snapshot import FinishedRequest

from .fakes import FakeBackend, FakeClock, ServerStream, chat, expected_text

TOKEN_S = 0.01
EXAMPLES = hyp_settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass(frozen=True)
class Job:
    """One request of a generated workload and what its caller does."""

    lane: Lane
    requester: int
    prompt: int
    answer: int
    delay: int
    """Event-loop rounds before it is submitted."""
    action: str
    """"read" (to the end), "drop" (stop after ``after`` chunks), "cancel" (cancel the task after
    ``after`` rounds), "fail" (the server fails after ``after`` tokens)."""
    after: int


jobs_strategy = st.lists(
    st.builds(
        Job,
        lane=st.sampled_from(list(LANES)),
        requester=st.integers(0, 3),
        prompt=st.integers(1, 300),
        answer=st.integers(1, 12),
        delay=st.integers(0, 40),
        action=st.sampled_from(["read", "read", "read", "drop", "cancel", "fail"]),
        after=st.integers(0, 6),
    ),
    min_size=1,
    max_size=24,
)

settings_strategy = st.builds(
    SchedulerSettings,
    policy=st.sampled_from([Policy.LANES, Policy.LANES, Policy.FIFO]),
    max_sequences=st.integers(1, 4),
    prefill_budget=st.integers(50, 400),
    headroom=st.integers(0, 2),
    aging_s=st.sampled_from([0.0, 0.05, 30.0]),
    background_share=st.sampled_from([0.0, 0.2]),
    preemption=st.booleans(),
    prefill_guard_tokens=st.sampled_from([50, 1024]),
    background_with_voice=st.sampled_from([None, None, 0, 1]),
)


async def _run_workload(
    settings: SchedulerSettings, jobs: list[Job], max_wait: float
) -> None:
    clock = FakeClock()
    for lane in LANES:
        settings = settings.with_lane(lane, max_wait_s=max_wait, max_queued=100)
    backend = FakeBackend(clock, token_s=TOKEN_S)
    scheduler = Scheduler(backend, settings, clock=clock)
    finished: list[FinishedRequest] = []
    scheduler.add_listener(finished.append)
    queue = scheduler._state
    budget = settings.prefill_budget

    def check(_: ServerStream) -> None:
        active = backend.active
        assert len(active) <= settings.max_sequences
        # The prefill budget bounds the prompts in prefill (no token sent yet), one alone aside.
        prefilling = [s for s in active if s.tokens_sent == 0]
        assert (
            len(prefilling) <= 1 or sum(s.prompt_tokens for s in prefilling) <= budget
        )
        assert queue.in_flight <= settings.max_sequences
        assert queue.prefill_in_flight <= queue.prompt_in_flight
        in_prefill = [r for r in queue.running.values() if r.prefilling]
        assert len(in_prefill) <= 1 or queue.prefill_in_flight <= budget
        scheduler.tick()

    backend.on_start = check
    backend.on_token = check
    submitted: list[Job] = []

    async def caller(job: Job) -> None:
        for _ in range(job.delay):
            await asyncio.sleep(0)
        request = chat(
            answer_tokens=job.answer,
            prompt_tokens=job.prompt,
            fail_after=job.after if job.action == "fail" else None,
        )
        stream = scheduler.stream(
            request,
            lane=job.lane,
            requester=f"r{job.requester}",
            prompt_tokens=job.prompt,
        )
        text = []
        # The first step of the stream submits it, with no await before: from here on it counts.
        submitted.append(job)
        try:
            async for chunk in stream:
                text.append(chunk.text)
                if job.action == "drop" and len(text) > job.after:
                    break
        except LanesError:
            return
        finally:
            await stream.aclose()
        if job.action == "read":
            assert "".join(text) == expected_text(job.answer)

    tasks = [asyncio.create_task(caller(job)) for job in jobs]
    for job, task in zip(jobs, tasks, strict=True):
        if job.action == "cancel":
            for _ in range(job.delay + job.after):
                await asyncio.sleep(0)
            task.cancel()
    async with asyncio.timeout(20):
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(
            result, asyncio.CancelledError
        ):
            raise result

    # Every request left exactly once, and everything it held was given back.
    assert len(finished) == len(submitted)
    assert len({record.request_id for record in finished}) == len(submitted)
    assert queue.started_total == queue.released_total
    assert (
        queue.in_flight,
        queue.prompt_in_flight,
        queue.prefill_in_flight,
        queue.waiting,
    ) == (0, 0, 0, 0)
    assert backend.active == []
    assert scheduler._tickets == {}
    # Nobody was admitted after its lane's max wait; timed-out ones waited no longer than one
    # clock step past it.
    for record in finished:
        if record.preemptions:
            # A preempted request's wait restarts when it is requeued; its queue_wait_s is the
            # first one.
            continue
        if record.error == QueueTimeoutError.__name__:
            assert max_wait - 1e-9 <= record.queue_wait_s <= max_wait + TOKEN_S + 1e-9
        elif record.ttft_s is not None:
            assert record.queue_wait_s < max_wait
    await scheduler.close()


@EXAMPLES
@given(
    settings=settings_strategy,
    jobs=jobs_strategy,
    max_wait=st.sampled_from([0.05, 0.3, 60.0]),
)
def test_admission_and_release_invariants(
    settings: SchedulerSettings, jobs: list[Job], max_wait: float
) -> None:
    """Slots and prefill budget hold at every token; every request is released exactly once."""
    asyncio.run(_run_workload(settings, jobs, max_wait))


async def _run_vtc(
    max_sequences: int, heavy: list[tuple[int, int]], light: list[tuple[int, int]]
) -> tuple[float, float]:
    """Return the spread of the service difference, and VTC's bound."""
    clock = FakeClock()
    settings = SchedulerSettings(
        max_sequences=max_sequences, headroom=0, prefill_budget=10**6
    )
    backend = FakeBackend(clock, token_s=TOKEN_S)
    scheduler = Scheduler(backend, settings, clock=clock)
    service = {"a": 0.0, "b": 0.0}
    started = {"a": 0, "b": 0}
    total = {"a": len(heavy), "b": len(light)}
    differences: list[float] = []

    def backlogged() -> bool:
        return all(started[who] < total[who] for who in service)

    def on_start(stream: ServerStream) -> None:
        who = str(stream.request.options["tag"])
        started[who] += 1
        service[who] += settings.input_weight * stream.prompt_tokens
        if backlogged():
            differences.append(service["a"] - service["b"])

    def on_token(stream: ServerStream) -> None:
        service[str(stream.request.options["tag"])] += settings.output_weight
        if backlogged():
            differences.append(service["a"] - service["b"])

    backend.on_start = on_start
    backend.on_token = on_token
    calls = [
        scheduler.generate(
            chat(answer_tokens=answer, prompt_tokens=prompt, tag=who),
            lane=Lane.AUTOMATION,
            requester=who,
            prompt_tokens=prompt,
        )
        for who, jobs in (("a", heavy), ("b", light))
        for prompt, answer in jobs
    ]
    async with asyncio.timeout(20):
        await asyncio.gather(*calls)
    prompts = [p for p, _ in heavy + light]
    answers = [a for _, a in heavy + light]
    # Sheng et al. bound the difference by 2 * max(w_in * L_input, w_out * M), where L_input is the
    # longest prompt and M the most tokens a running batch holds (the KV cache: prompt and output
    # tokens of every sequence in flight): here max_sequences requests of the longest prompt and
    # answer.
    batch_tokens = max_sequences * (max(prompts) + max(answers))
    bound = 2 * max(
        settings.input_weight * max(prompts), settings.output_weight * batch_tokens
    )
    spread = max(differences) - min(differences) if differences else 0.0
    await scheduler.close()
    return spread, bound


request_sizes = st.tuples(st.integers(1, 60), st.integers(1, 25))


@EXAMPLES
@given(
    max_sequences=st.integers(1, 3),
    heavy=st.lists(request_sizes, min_size=8, max_size=16),
    light=st.lists(request_sizes, min_size=8, max_size=16),
)
def test_vtc_fairness_bound(
    max_sequences: int, heavy: list[tuple[int, int]], light: list[tuple[int, int]]
) -> None:
    """Two backlogged requesters' weighted service differs by at most 2*max(w_in*L, w_out*M).

    Checked over every interval in which both are backlogged (the spread of the running difference).
    """
    spread, bound = asyncio.run(_run_vtc(max_sequences, heavy, light))
    assert spread <= bound


async def _run_share(
    share: float,
    window_s: float,
    interactive: list[tuple[int, int]],
    background: list[tuple[int, int]],
) -> list[tuple[float, float, float]]:
    """Return (window end, background service, total service) for windows under full load."""
    clock = FakeClock()
    settings = SchedulerSettings(
        max_sequences=1,
        headroom=0,
        aging_s=0.0,
        background_share=share,
        share_window_s=window_s,
    ).with_lane(Lane.INTERACTIVE, max_queued=100)
    backend = FakeBackend(clock, token_s=TOKEN_S)
    scheduler = Scheduler(backend, settings, clock=clock)
    events: list[tuple[float, bool, float]] = []
    started = {"bg": 0, "fg": 0}
    total = {"bg": len(background), "fg": len(interactive)}
    loaded_until: list[float] = []

    def on_start(stream: ServerStream) -> None:
        tag = str(stream.request.options["tag"])
        started[tag] += 1
        if not loaded_until and any(started[t] >= total[t] for t in total):
            loaded_until.append(clock.now)
        events.append(
            (clock.now, tag == "bg", settings.input_weight * stream.prompt_tokens)
        )

    def on_token(stream: ServerStream) -> None:
        tag = str(stream.request.options["tag"])
        events.append((clock.now, tag == "bg", settings.output_weight))

    backend.on_start = on_start
    backend.on_token = on_token
    start = clock.now
    calls = [
        scheduler.generate(
            chat(answer_tokens=answer, prompt_tokens=prompt, tag=tag),
            lane=lane,
            requester=tag,
            prompt_tokens=prompt,
        )
        for tag, lane, jobs in (
            ("fg", Lane.INTERACTIVE, interactive),
            ("bg", Lane.BACKGROUND, background),
        )
        for prompt, answer in jobs
    ]
    async with asyncio.timeout(20):
        await asyncio.gather(*calls)
    await scheduler.close()
    end = loaded_until[0] if loaded_until else clock.now
    windows = []
    for t_end in sorted({t for t, _, _ in events}):
        if t_end - window_s < start or t_end > end:
            continue
        inside = [(bg, w) for t, bg, w in events if t_end - window_s < t <= t_end]
        windows.append(
            (t_end, sum(w for bg, w in inside if bg), sum(w for _, w in inside))
        )
    return windows


@EXAMPLES
@given(
    share=st.sampled_from([0.1, 0.25, 0.5]),
    interactive=st.lists(request_sizes, min_size=30, max_size=40),
    background=st.lists(request_sizes, min_size=15, max_size=20),
)
def test_background_share_under_continuous_load(
    share: float, interactive: list[tuple[int, int]], background: list[tuple[int, int]]
) -> None:
    """Under continuous interactive load, background gets its share of every window, less one request."""
    window_s = 1.0
    windows = asyncio.run(_run_share(share, window_s, interactive, background))
    one_request = max(p + 2 * a for p, a in interactive + background)
    for t_end, bg, total in windows:
        assert bg >= share * total - one_request, (t_end, bg, total)


async def _run_preemption(
    max_sequences: int, background: list[int], voice: list[tuple[int, int]]
) -> list[FinishedRequest]:
    clock = FakeClock()
    settings = SchedulerSettings(
        max_sequences=max_sequences, headroom=0, prefill_budget=10**6
    )
    backend = FakeBackend(clock, token_s=TOKEN_S)
    scheduler = Scheduler(backend, settings, clock=clock)
    finished: list[FinishedRequest] = []
    scheduler.add_listener(finished.append)

    async def call(lane: Lane, answer: int, delay: int) -> None:
        for _ in range(delay):
            await asyncio.sleep(0)
        text = [
            chunk.text
            async for chunk in scheduler.stream(
                chat(answer_tokens=answer, tag=lane.key), lane=lane, requester=lane.key
            )
        ]
        # One seamless stream: every token exactly once, in order, however often it was cut.
        assert "".join(text) == expected_text(answer)

    calls = [call(Lane.BACKGROUND, answer, 0) for answer in background]
    calls += [call(Lane.VOICE, answer, delay) for answer, delay in voice]
    async with asyncio.timeout(20):
        await asyncio.gather(*calls)
    for stream in backend.streams:
        prefix = stream.request.assistant_prefix
        assert prefix == expected_text(len(prefix.split()))
        if stream.request.options["tag"] != "background":
            assert not stream.closed_early
    await scheduler.close()
    return finished


@EXAMPLES
@given(
    max_sequences=st.integers(1, 3),
    background=st.lists(st.integers(5, 40), min_size=1, max_size=4),
    voice=st.lists(
        st.tuples(st.integers(1, 6), st.integers(0, 80)), min_size=1, max_size=4
    ),
)
def test_preemption_is_seamless_and_spares_voice(
    max_sequences: int, background: list[int], voice: list[tuple[int, int]]
) -> None:
    """Preempted background answers arrive whole and in order; voice streams are never cut."""
    finished = asyncio.run(_run_preemption(max_sequences, background, voice))
    assert all(record.outcome == "ok" for record in finished)
    assert all(
        record.preemptions == 0 for record in finished if record.lane is Lane.VOICE
    )
