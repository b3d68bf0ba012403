"""What the scheduler does for voice and typed chats: slots placed, room made, streams limited."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.snapshot import GenerateResult

from .fakes import FakeBackend, FakeClock, ServerStream, chat, settle
from .test_scheduler import spawn

ASSIST = "You are the voice assistant of this home. Exposed entities: kitchen light, hall light."


def _placed(**settings: object) -> tuple[Scheduler, FakeBackend, FakeClock]:
    """Build a scheduler over a fake server that lets clients choose slots (as llama.cpp).

    The fake server frees a cancelled slot at once, and the scheduler has measured that (a
    server not measured yet is taken as slow to let go: ``Foreground.cancels_quickly``).
    """
    clock = FakeClock()
    backend = FakeBackend(clock, chooses_slots=True)
    values: dict[str, object] = {"max_sequences": 4, "server_slots": 4, "headroom": 1}
    values.update(settings)
    scheduler = Scheduler(backend, SchedulerSettings(**values), clock=clock)  # type: ignore[arg-type]
    scheduler._slots._latencies.append(0.0)
    return scheduler, backend, clock


def _command(text: str, **options: object) -> ChatRequest:
    """Build a voice command on the Assist prompt (with the fake server options)."""
    base = chat(**options)  # type: ignore[arg-type]
    return ChatRequest(
        model=base.model,
        messages=(
            ChatMessage(role="system", content=ASSIST),
            ChatMessage(role="user", content=text),
        ),
        options=base.options,
    )


async def _voice(scheduler: Scheduler, text: str, **options: object) -> GenerateResult:
    """Send a voice command and wait for its answer."""
    return await scheduler.generate(
        _command(text, tag="voice", **options), lane=Lane.VOICE, requester="v"
    )


def _slots(backend: FakeBackend, tag: str) -> list[int | None]:
    return [s.request.slot for s in backend.streams if s.request.options["tag"] == tag]


async def test_voice_keeps_its_slot_while_background_runs_on_the_others() -> None:
    """Commands land on the reserved slot that holds the Assist prompt; summaries never take it."""
    scheduler, backend, _ = _placed()
    gate = asyncio.Event()
    jobs = [
        spawn(scheduler, chat(gate=gate, tag="job"), Lane.BACKGROUND, f"job{i}")
        for i in range(3)
    ]
    await settle()
    for text in ("turn on the kitchen", "turn off the hall", "what time is it"):
        await scheduler.generate(
            _command(text, tag="voice"), lane=Lane.VOICE, requester="satellite"
        )
    gate.set()
    await asyncio.gather(*jobs)
    assert _slots(backend, "voice") == [0, 0, 0]
    assert sorted(_slots(backend, "job")) == [1, 2, 3]


async def test_preempted_background_resumes_on_its_own_slot() -> None:
    """The resumed attempt goes back to where its prompt and output are cached."""
    scheduler, backend, clock = _placed(headroom=0, max_sequences=2, server_slots=2)
    jobs = [
        spawn(
            scheduler, chat(answer_tokens=40, tag=f"job{i}"), Lane.BACKGROUND, f"j{i}"
        )
        for i in range(2)
    ]
    await settle(8)
    clock.advance(1.0)  # past the settling time of a cancelled slot
    voice = await _voice(scheduler, "turn on", answer_tokens=3)
    await asyncio.gather(*jobs)
    assert voice.finished.outcome == "ok"
    preempted = [s for s in backend.streams if s.closed_early]
    assert len(preempted) == 1
    tag = preempted[0].request.options["tag"]
    first, resumed = _slots(backend, tag)
    assert resumed == first


@dataclass
class _SlotsReadServer(FakeBackend):
    """A server that chooses slots and counts the reads of its ``/slots``."""

    slot_reads: int = 0

    async def busy_slots(self) -> frozenset[int] | None:
        """Count the read, answer as the fake server does."""
        self.slot_reads += 1
        return await super().busy_slots()


async def test_commands_that_end_as_the_server_ends_them_never_read_the_slots() -> None:
    """No round trip to ``/slots`` before a command whose slot the last one left ended.

    Only a slot freed by a stream stopped mid-answer may still be busy at the server: the
    next command placed on it reads ``/slots`` first, once (the fake server lets go at once).
    """
    clock = FakeClock()
    backend = _SlotsReadServer(clock, chooses_slots=True)
    scheduler = Scheduler(
        backend,
        SchedulerSettings(max_sequences=4, server_slots=4, headroom=1),
        clock=clock,
    )
    for text in ("turn on the kitchen", "turn off the hall", "what time is it"):
        assert (await _voice(scheduler, text)).finished.outcome == "ok"
    assert backend.slot_reads == 0
    stream = scheduler.stream(
        _command("tell me a story", tag="voice", answer_tokens=50),
        lane=Lane.VOICE,
        requester="v",
    )
    async for chunk in stream:
        if chunk.text:
            break
    await stream.aclose()
    await _voice(scheduler, "turn on the fan")
    assert backend.slot_reads == 1
    assert _slots(backend, "voice") == [0, 0, 0, 0, 0]


async def test_no_slot_is_named_where_the_server_chooses() -> None:
    """Ollama and vLLM place requests themselves: no slot is sent."""
    clock = FakeClock()
    backend = FakeBackend(clock)
    scheduler = Scheduler(
        backend, SchedulerSettings(max_sequences=4, server_slots=4), clock=clock
    )
    await scheduler.generate(
        _command("hi", tag="voice"), lane=Lane.VOICE, requester="v"
    )
    assert backend.streams[0].request.slot is None


async def test_prepare_makes_room_before_the_command_arrives() -> None:
    """An announced command holds long background prompts back until it came or timed out."""
    scheduler, backend, clock = _placed(prefill_guard_tokens=100)
    scheduler.prepare()
    waiting = spawn(
        scheduler, chat(tag="long"), Lane.BACKGROUND, "job", prompt_tokens=800
    )
    await settle()
    assert backend.streams == []
    clock.advance(11.0)  # the command never came
    scheduler.tick()
    await waiting
    assert [s.request.options["tag"] for s in backend.streams] == ["long"]


async def test_prepare_preempts_a_background_prefill_and_the_command_clears_it() -> (
    None
):
    """A long prompt the server is still prefilling makes way at once; the command ends the hold."""
    scheduler, backend, _ = _placed(prefill_guard_tokens=100)
    gate = asyncio.Event()
    job = spawn(
        scheduler, chat(gate=gate, tag="job"), Lane.BACKGROUND, "job", prompt_tokens=800
    )
    await settle()
    assert len(backend.streams) == 1  # still prefilling: no token yet
    scheduler.prepare()
    await settle()
    assert backend.streams[0].closed_early
    await scheduler.generate(
        _command("lights", tag="voice"), lane=Lane.VOICE, requester="v"
    )
    gate.set()
    result = await job
    assert result.finished.preemptions == 1
    assert [s.request.options["tag"] for s in backend.streams] == [
        "job",
        "voice",
        "job",
    ]


async def test_learned_limit_stops_background_slowing_voice() -> None:
    """On a server where each stream costs a whole pass, background makes way while voice talks.

    The fake server advances the clock by ``token_s`` for every token of every stream, so with n
    streams each one's gap is n times that: what a CPU does. The scheduler learns it from the
    background streams alone (one, two, then three at once) and, once voice speaks, keeps only
    what holds voice's slowdown objective (twice its gap alone): one background stream.
    """
    scheduler, backend, _ = _placed()
    jobs = []
    for i in range(3):
        jobs.append(
            spawn(
                scheduler, chat(answer_tokens=300, tag="job"), Lane.BACKGROUND, f"j{i}"
            )
        )
        await settle(40)
    voice = await _voice(scheduler, "turn on", answer_tokens=20)
    await asyncio.gather(*jobs)
    assert voice.finished.outcome == "ok"
    # Beside one background stream, voice's gaps are two passes each.
    assert voice.finished.itl_p95_s is not None
    assert voice.finished.itl_p95_s <= 2 * backend.token_s + 1e-9
    assert scheduler.snapshot().preemptions_total == 2
    points = scheduler.batch_cost.points(0.0)
    assert [p.sequences for p in points][:3] == [1, 2, 3]


async def test_long_foreground_prompts_keep_their_slots_warm() -> None:
    """With Assist-sized prompts the headroom is not lent, and grows to the overlap seen.

    Short foreground prompts cost little to prefill again, so background borrows the headroom
    while the foreground is idle; an Assist prompt of thousands of tokens does not, and when a
    chat and a command overlapped, two slots are kept for the foreground.
    """
    # No share owed (background_share 0): owed its share, background would take the headroom.
    scheduler, backend, _ = _placed(
        prefill_guard_tokens=500, background_share=0, learn_headroom=True
    )
    headroom = scheduler._foreground.headroom
    await scheduler.generate(
        chat(tag="v"), lane=Lane.VOICE, requester="v", prompt_tokens=100
    )
    assert headroom.lendable
    gate = asyncio.Event()
    jobs = [
        spawn(scheduler, chat(gate=gate, tag="job"), Lane.BACKGROUND, f"j{i}")
        for i in range(4)
    ]
    await settle()
    assert len(backend.active) == 4  # the headroom slot lent while nothing else runs
    gate.set()
    await asyncio.gather(*jobs)

    typing = asyncio.Event()
    chat_task = spawn(
        scheduler,
        chat(gate=typing, tag="chat"),
        Lane.INTERACTIVE,
        "u",
        prompt_tokens=2600,
    )
    await settle()
    command = spawn(scheduler, chat(tag="cmd"), Lane.VOICE, "v", prompt_tokens=2600)
    await settle()
    typing.set()
    await asyncio.gather(chat_task, command)
    assert not headroom.lendable
    assert headroom.slots == 2
    assert scheduler._slots.table is not None
    assert scheduler._slots.table.reserved == 2
    gate = asyncio.Event()
    jobs = [
        spawn(scheduler, chat(gate=gate, tag="job"), Lane.BACKGROUND, f"k{i}")
        for i in range(4)
    ]
    await settle()
    assert len(backend.active) == 2  # two slots kept for voice and chats
    gate.set()
    await asyncio.gather(*jobs)


async def test_a_gap_that_spans_a_task_launch_is_not_learned() -> None:
    """The batch curve learns only from gaps that span no task launch.

    A launch may stall the server's loop (llama.cpp copying slots to its host prompt cache).
    """
    scheduler, backend, clock = _placed()
    state = scheduler._state

    def stall(stream: ServerStream) -> None:
        if stream.tokens_sent == 10:
            state.task_launched()  # a prefill step of another request, say
            clock.advance(0.5)

    backend.on_token = stall
    await scheduler.generate(
        chat(answer_tokens=20, tag="job"), lane=Lane.BACKGROUND, requester="j"
    )
    (alone,) = scheduler.batch_cost.points(0.0)
    # 20 tokens: 19 gaps, less the one across the launch.
    assert alone.samples == 18
    assert alone.itl_s == pytest.approx(backend.token_s)
