"""Slot placement: the foreground keeps its slots and its prompt caches warm."""

from __future__ import annotations

from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest, ToolSpec
from custom_components.llm_lanes.core.prompt_prefixes import PrefixKeys
from custom_components.llm_lanes.core.slots import (
    CANCEL_SETTLE_S,
    SlotTable,
    prefix_keys,
)

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
