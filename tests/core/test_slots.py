"""Slot placement: the foreground keeps its slots and its prompt caches warm."""

from __future__ import annotations

import pytest

from custom_components.llm_lanes.core.foreground import LEND_MAX_CANCEL_S, Foreground
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest, ToolSpec
from custom_components.llm_lanes.core.prompt_prefixes import PrefixKeys
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.slots import (
    CANCEL_SETTLE_S,
    SETTLE_POLL_S,
    SlotPlacer,
    SlotTable,
    prefix_keys,
)

from .boxes import now, run_virtual
from .fakes import FakeBackend, FakeClock

ASSIST = "You are Home Assistant's voice assistant. Exposed entities: ..."
NO_KEYS = PrefixKeys(stable=None, conversation=None)


def _request(system: str | None, user: str, *, tools: bool = False) -> ChatRequest:
    messages = [ChatMessage(role="user", content=user)]
    if system is not None:
        messages.insert(0, ChatMessage(role="system", content=system))
    return ChatRequest(
        model="m",
        messages=tuple(messages),
        tools=(ToolSpec("HassTurnOn", "Turn on", {"type": "object"}),) if tools else (),
    )


def test_prefix_keys() -> None:
    """The stable prefix is the system prompt and tools; the conversation adds its first turn."""
    turn_on = prefix_keys(_request(ASSIST, "turn on the kitchen", tools=True))
    turn_off = prefix_keys(_request(ASSIST, "turn off the kitchen", tools=True))
    assert turn_on.stable == turn_off.stable
    assert turn_on.conversation != turn_off.conversation
    assert prefix_keys(_request(ASSIST, "x")).stable != turn_on.stable  # no tools
    assert prefix_keys(_request(None, "hello")).stable is None
    follow_up = ChatRequest(
        model="m",
        messages=(
            ChatMessage(role="system", content=ASSIST),
            ChatMessage(role="user", content="turn on the kitchen"),
            ChatMessage(role="assistant", content="Done."),
            ChatMessage(role="user", content="and the hall"),
        ),
        tools=(ToolSpec("HassTurnOn", "Turn on", {"type": "object"}),),
    )
    assert prefix_keys(follow_up).conversation == turn_on.conversation


def test_foreground_takes_reserved_slots_and_background_avoids_them() -> None:
    """Voice lands on a reserved slot; background fills the others first, reserved ones last."""
    table = SlotTable(4, reserved=1)
    assert table.assign(1, Lane.VOICE, NO_KEYS, previous=None, now=0.0) == 0
    table.release(1, 0.0)
    placed = [
        table.assign(seq, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)
        for seq in (2, 3, 4)
    ]
    assert placed == [1, 2, 3]
    # Every other slot taken: background may take the reserved one (admission allowed it).
    assert table.assign(5, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0) == 0
    assert table.assign(6, Lane.VOICE, NO_KEYS, previous=None, now=0.0) is None


def test_requests_return_to_the_slot_holding_their_prefix() -> None:
    """A command finds the slot with the Assist prompt; a chat's next turn finds its conversation."""
    table = SlotTable(4, reserved=1)
    command = prefix_keys(_request(ASSIST, "turn on the kitchen", tools=True))
    chat = prefix_keys(_request(ASSIST, "what is the weather?", tools=True))
    # The reserved slot is busy: the first command goes to slot 1 and leaves its prompt there.
    table.assign(100, Lane.INTERACTIVE, NO_KEYS, previous=None, now=0.0)
    assert table.assign(1, Lane.VOICE, command, previous=None, now=0.0) == 1
    table.release(1, 1.0)
    table.release(100, 1.0)
    # Another command prefers slot 1 (its prefix is cached there) over the free reserved slot.
    other = prefix_keys(_request(ASSIST, "turn off the hall", tools=True))
    assert table.assign(2, Lane.VOICE, other, previous=None, now=2.0) == 1
    assert table.assign(3, Lane.INTERACTIVE, chat, previous=None, now=2.0) == 0
    table.release(2, 3.0)
    table.release(3, 3.0)
    # The chat's next turn returns to its own conversation, not just the shared prefix.
    assert table.assign(4, Lane.INTERACTIVE, chat, previous=None, now=4.0) == 0


def test_background_keeps_off_a_slot_holding_a_foreground_prompt() -> None:
    """With two free slots, background takes the one whose cache the foreground does not need."""
    table = SlotTable(3, reserved=1)
    command = prefix_keys(_request(ASSIST, "turn on", tools=True))
    table.assign(50, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)  # slot 1
    table.assign(1, Lane.VOICE, command, previous=None, now=0.0)  # slot 0
    table.assign(
        2, Lane.VOICE, command, previous=None, now=0.0
    )  # slot 2: holds Assist now
    table.release(2, 1.0)
    table.release(50, 1.0)
    assert table.assign(3, Lane.BACKGROUND, NO_KEYS, previous=None, now=2.0) == 1


def test_resumed_request_returns_to_its_own_slot() -> None:
    """After a preemption a stream resumes where its prompt and output are still cached."""
    table = SlotTable(4, reserved=1)
    for seq in (1, 2, 3):
        table.assign(seq, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)
    assert table.slot_of(2) == 2
    table.release(2, 1.0, cancelled=True)
    table.release(3, 1.0)
    later = 1.0 + 2 * CANCEL_SETTLE_S
    assert table.assign(2, Lane.BACKGROUND, NO_KEYS, previous=2, now=later) == 2


def test_a_slot_freed_by_a_cancellation_is_taken_last_for_a_moment() -> None:
    """The server may still hold a slot whose stream was just cancelled."""
    table = SlotTable(2, reserved=0)
    table.assign(1, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)
    table.assign(2, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)
    table.release(1, 1.0, cancelled=True)
    table.release(2, 1.0)
    assert table.assign(3, Lane.VOICE, NO_KEYS, previous=None, now=1.0) == 1
    table.release(3, 1.1)
    assert table.assign(4, Lane.VOICE, NO_KEYS, previous=None, now=1.1) == 1


def test_resize_keeps_running_slots() -> None:
    """Fewer slots take effect once the ones going away are free."""
    table = SlotTable(4, reserved=1)
    table.assign(1, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)
    table.assign(2, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)
    table.assign(3, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)
    table.resize(2, 1)
    assert table.size == 4  # slots 2 and 3 still run requests
    table.release(2, 1.0)
    table.release(3, 1.0)
    table.resize(2, 1)
    assert (table.size, table.reserved) == (2, 1)
    table.resize(6, 2)
    assert (table.size, table.reserved, table.holder_count()) == (6, 2, 1)


def test_a_slot_the_request_keeps_is_taken_before_one_it_would_copy_away() -> None:
    """A slot the host prompt cache would copy away is taken last.

    llama.cpp copies a slot a request keeps less than half of: an empty slot, or of the others
    the one holding least, is taken first.
    """
    table = SlotTable(4, reserved=0)
    for seq in (1, 2, 3):
        table.assign(seq, Lane.BACKGROUND, NO_KEYS, previous=None, now=0.0)
    table.release(1, 1.0, tokens=3000)
    table.release(2, 1.0, tokens=400)
    # Slot 3 was never used: nothing to copy.
    assert table.assign(4, Lane.BACKGROUND, NO_KEYS, previous=None, now=2.0) == 3
    # Of the slots it would overwrite, the one holding least.
    assert table.assign(5, Lane.BACKGROUND, NO_KEYS, previous=None, now=2.0) == 1
    assert table.assign(6, Lane.AUTOMATION, NO_KEYS, previous=None, now=2.0) == 0


def test_a_prefix_kept_is_no_copy_but_a_short_prefix_of_a_long_slot_is() -> None:
    """Keeping the Assist prompt keeps most of a command's slot.

    A short system prompt shared with a long summary keeps too little of it, and an empty slot is
    taken instead.
    """
    assist = "x" * 8000
    command = prefix_keys(_request(assist, "turn on", tools=True))
    assert command.stable_tokens >= 2000
    table = SlotTable(3, reserved=0)
    table.assign(1, Lane.VOICE, command, previous=None, now=0.0)
    table.release(1, 1.0, tokens=2100)
    assert table.assign(2, Lane.VOICE, command, previous=None, now=2.0) == 0
    short = prefix_keys(_request("Summarize.", "log " * 1000))
    table.assign(3, Lane.BACKGROUND, short, previous=None, now=2.0)  # slot 1
    table.release(3, 3.0, tokens=1500)
    other = prefix_keys(_request("Summarize.", "other log " * 1000))
    assert table.assign(4, Lane.BACKGROUND, other, previous=None, now=4.0) == 2


class _SlotsServer(FakeBackend):
    """A server that reports a cancelled slot busy for its first ``held`` reads of ``/slots``."""

    def __init__(self, held: int | None) -> None:
        super().__init__(FakeClock(), chooses_slots=True)
        self.held = held
        self.reads = 0

    async def busy_slots(self) -> frozenset[int] | None:
        if self.held is None:
            return None
        self.reads += 1
        return frozenset({0}) if self.reads <= self.held else frozenset()


def _cancelled_slot(backend: FakeBackend) -> SlotPlacer:
    """Return a placer whose one slot was just freed by a cancellation."""
    placer = SlotPlacer(backend)
    placer.resize(SchedulerSettings(max_sequences=1, server_slots=1), 0)
    table = placer.table
    assert table is not None
    table.assign(1, Lane.BACKGROUND, NO_KEYS, previous=None, now=now())
    table.release(1, now(), cancelled=True)
    return placer


def test_a_cancelled_slot_is_named_once_the_server_reports_it_free() -> None:
    """The attempt on a slot the server may still hold waits for ``/slots`` to say it is free."""

    async def main() -> tuple[float, int]:
        backend = _SlotsServer(held=3)
        placer = _cancelled_slot(backend)
        start = now()
        await placer.settled(0, now())
        return now() - start, backend.reads

    waited, reads = run_virtual(main)
    assert reads == 4
    assert waited == pytest.approx(3 * SETTLE_POLL_S)


def test_without_slot_reports_a_cancelled_slot_is_named_at_once() -> None:
    """A server that does not report its slots gets the task at once (it defers it itself)."""

    async def main() -> tuple[float, float | None]:
        placer = _cancelled_slot(_SlotsServer(held=None))
        start = now()
        await placer.settled(0, now())
        return now() - start, placer.cancel_latency_s

    assert run_virtual(main) == (0.0, None)


def test_the_server_s_cancellation_latency_decides_whether_the_headroom_is_lent() -> (
    None
):
    """A slot freed in a few ms is cheap to take back; one held most of a second is not."""

    async def main(held: int) -> bool:
        placer = _cancelled_slot(_SlotsServer(held=held))
        await placer.settled(0, now())
        foreground = Foreground(4, placer)
        return foreground.lends_headroom()

    assert run_virtual(lambda: main(1))
    assert not run_virtual(lambda: main(int(2 * LEND_MAX_CANCEL_S / SETTLE_POLL_S)))
