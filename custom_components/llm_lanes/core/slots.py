"""Which server slot a request runs on, so the prompts worth keeping stay in the server's cache.

A llama.cpp slot keeps the prompt of the last request it served; a new request placed on it
evaluates only what differs from that prompt. Home Assistant's Assist prompt (system prompt,
exposed entities, tool schemas: thousands of tokens) is the same for every voice command, so the
first token of a command is fast only if its slot still holds that prompt, and a long background
summary placed on that slot evicts it. Where the server lets clients choose the slot
(``Backend.chooses_slots``), the scheduler places every request itself:

- the first ``reserved`` slots are the foreground's (voice and interactive prefer them, and
  background never takes them while another slot is free);
- a request returns to a slot that holds its own conversation, else its stable prefix (the system
  prompt and tools), else an idle slot whose cache is least worth keeping for it;
- a request resumed after a preemption returns to the slot it left (its prompt and the output so
  far are still cached there);
- a slot freed by a cancellation is named only once the server has let go of it too (it notices
  a closed stream at its next token write, or within a second: ``/slots`` says when), and taken
  last meanwhile;
- on a llama-server with a host prompt cache (``--cache-ram``, on by default since late 2025) a
  task that would keep less than half of its slot's content copies that content to host memory
  first, blocking the server's loop: a free slot the request keeps (its own prefix or
  conversation) or an empty one is taken before one it would overwrite, and of those the one
  holding least;
- an urgent lane (voice) has the first claim on the warm copies of its prefix: a request of
  another foreground lane (a typed chat, whose objective allows a prefill) does not take the
  last idle slot holding a prefix voice used lately while another slot is free.

Where the server chooses on its own (Ollama, which matches prefixes across its free slots), the
headroom that keeps a slot free of background is what keeps a prefix warm; vLLM caches prefixes
across the whole KV cache, so nothing needs pinning there.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, replace
import hashlib
import statistics
from typing import TYPE_CHECKING

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.errors import BackendError
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatRequest
from custom_components.llm_lanes.core.prompt_prefixes import PrefixKeys
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.tokens import CHARS_PER_TOKEN

if TYPE_CHECKING:
    from custom_components.llm_lanes.core.ticket import Ticket

CANCEL_SETTLE_S = 1.0
"""How long a server may hold a slot after its stream was closed (llama.cpp notices at its next
token write, or within a second); where the server does not report its slots, a cancelled slot is
named only after that."""
SETTLE_POLL_S = 0.02
"""How often the server's slots are read while an attempt waits for its cancelled slot."""
LATENCIES_KEPT = 8
"""Cancellations whose latency at the server ``cancel_latency_s`` follows."""
KEEP_MIN = 0.5
"""The share of a slot's content a request must keep not to have it copied to the host prompt
cache first (llama.cpp's ``f_keep``)."""
URGENT_PREFIX_MEMORY_S = 600.0
"""How long a prefix an urgent request used keeps its first claim on warm slots."""


def prefix_keys(request: ChatRequest) -> PrefixKeys:
    """Return the digests a request's slot is matched by."""
    stable = hashlib.blake2b(digest_size=12)
    has_stable = False
    stable_chars = 0
    first_user: str | None = None
    for message in request.messages:
        if message.role == "system":
            stable.update(b"\x00s")
            stable.update(message.content.encode())
            stable_chars += len(message.content)
            has_stable = True
        elif message.role == "user":
            first_user = message.content
            break
    for tool in request.tools:
        stable.update(b"\x00t")
        stable.update(tool.name.encode())
        stable.update(tool.description.encode())
        stable_chars += len(tool.name) + len(tool.description)
        has_stable = True
    stable_key = stable.hexdigest() if has_stable else None
    conversation_key = None
    if first_user is not None:
        conversation = stable.copy()
        conversation.update(b"\x00u")
        conversation.update(first_user.encode())
        conversation_key = conversation.hexdigest()
    return PrefixKeys(
        stable=stable_key,
        conversation=conversation_key,
        stable_tokens=stable_chars // CHARS_PER_TOKEN,
    )


@dataclass(slots=True)
class _Slot:
    holder: int | None = None
    """Sequence number of the request running here."""
    keys: PrefixKeys | None = None
    """What the slot's cache holds (the last request's prefixes)."""
    lane: Lane | None = None
    """Lane of the last request served here."""
    last_seq: int | None = None
    freed_at: float = float("-inf")
    cancelled: bool = False
    """The last request here was cancelled: the server may not have let go of the slot yet."""
    tokens: int = 0
    """What the slot's cache holds (estimated tokens: the last request's prompt and answer)."""


class SlotTable:
    """The server's slots as the scheduler places requests on them."""

    __slots__ = ("_by_seq", "_reserved", "_slots", "_urgent_prefixes")

    def __init__(self, slots: int, reserved: int) -> None:
        """Track ``slots`` slots, of which the first ``reserved`` are the foreground's."""
        self._slots = [_Slot() for _ in range(max(slots, 0))]
        self._reserved = reserved
        self._by_seq: dict[int, int] = {}
        self._urgent_prefixes: dict[str, float] = {}
        """Stable prefixes urgent requests used, and when last."""

    @property
    def size(self) -> int:
        """How many slots the table places requests on."""
        return len(self._slots)

    @property
    def reserved(self) -> int:
        """How many of them are kept for the foreground."""
        return self._reserved

    def resize(self, slots: int, reserved: int) -> None:
        """Follow new settings; slots that disappear are forgotten once free."""
        slots = max(slots, 0)
        if slots > len(self._slots):
            self._slots.extend(_Slot() for _ in range(slots - len(self._slots)))
        elif slots < len(self._slots) and not any(
            slot.holder is not None for slot in self._slots[slots:]
        ):
            del self._slots[slots:]
        self._reserved = reserved

    def holder_count(self) -> int:
        """Slots running a request."""
        return len(self._by_seq)

    def slot_of(self, seq: int) -> int | None:
        """Return the slot a running request holds."""
        return self._by_seq.get(seq)

    def holds(self, keys: PrefixKeys) -> tuple[bool, bool]:
        """Whether a free slot's cache holds the conversation, and the stable prefix (for routing)."""
        conversation = stable = False
        for slot in self._slots:
            if slot.holder is None and (cached := slot.keys) is not None:
                conversation |= (
                    keys.conversation is not None
                    and cached.conversation == keys.conversation
                )
                stable |= keys.stable is not None and cached.stable == keys.stable
        return conversation, stable

    def assign(
        self,
        seq: int,
        lane: Lane,
        keys: PrefixKeys,
        *,
        previous: int | None,
        now: float,
    ) -> int | None:
        """Place a request on the best free slot; None when every slot is taken."""
        if lane.urgent and keys.stable is not None:
            self._urgent_prefixes[keys.stable] = now
        spare = (
            self._spare_for_urgent(now)
            if lane.foreground and not lane.urgent
            else set()
        )
        best: int | None = None
        best_score: tuple[int, ...] | None = None
        for index, slot in enumerate(self._slots):
            if slot.holder is not None:
                continue
            score = (
                int(index not in spare),
                *self._score(
                    index,
                    slot,
                    lane,
                    keys,
                    own=previous == index and slot.last_seq == seq,
                    now=now,
                ),
            )
            if best_score is None or score > best_score:
                best, best_score = index, score
        if best is None:
            return None
        slot = self._slots[best]
        slot.holder = seq
        slot.keys = keys
        slot.lane = lane
        slot.last_seq = seq
        self._by_seq[seq] = best
        return best

    def only_spare_free(self, now: float) -> bool:
        """Whether every free slot is one a non-urgent foreground request should leave to voice."""
        free = {i for i, slot in enumerate(self._slots) if slot.holder is None}
        return bool(free) and free <= self._spare_for_urgent(now)

    def _spare_for_urgent(self, now: float) -> set[int]:
        """Return the idle slots a non-urgent foreground request should leave to voice.

        For each prefix an urgent request used lately: its last idle warm slot, when it has one.
        """
        horizon = now - URGENT_PREFIX_MEMORY_S
        for key, at in list(self._urgent_prefixes.items()):
            if at < horizon:
                del self._urgent_prefixes[key]
        spare: set[int] = set()
        for key in self._urgent_prefixes:
            warm = [
                index
                for index, slot in enumerate(self._slots)
                if slot.holder is None
                and slot.keys is not None
                and slot.keys.stable == key
            ]
            if len(warm) == 1:
                spare.add(warm[0])
        return spare

    def release(
        self, seq: int, now: float, *, cancelled: bool = False, tokens: int = 0
    ) -> None:
        """Free the slot a request held (``cancelled``: it was stopped mid-answer).

        ``tokens``: what its cache holds now (the request's prompt and answer).
        """
        index = self._by_seq.pop(seq, None)
        if index is None or index >= len(self._slots):
            return
        slot = self._slots[index]
        slot.holder = None
        slot.freed_at = now
        slot.cancelled = cancelled
        slot.tokens = tokens

    def unsettled(self, index: int, now: float) -> bool:
        """Whether a slot was freed by a cancellation the server may not have noticed yet."""
        if index >= len(self._slots):
            return False
        slot = self._slots[index]
        return slot.cancelled and now - slot.freed_at < CANCEL_SETTLE_S

    def since_freed(self, index: int, now: float) -> float:
        """Seconds since a slot was freed."""
        return now - self._slots[index].freed_at if index < len(self._slots) else 0.0

    def settle(self, index: int) -> None:
        """Note that the server has let go of a slot."""
        if index < len(self._slots):
            self._slots[index].cancelled = False

    def _score(
        self,
        index: int,
        slot: _Slot,
        lane: Lane,
        keys: PrefixKeys,
        *,
        own: bool,
        now: float,
    ) -> tuple[int, ...]:
        """Rank a free slot for a request (higher is better), most important criterion first.

        ``own``: the request itself ran here last (resumed after a preemption).
        """
        settled = not (slot.cancelled and now - slot.freed_at < CANCEL_SETTLE_S)
        cached = slot.keys
        conversation = int(
            cached is not None
            and keys.conversation is not None
            and cached.conversation == keys.conversation
        )
        stable = int(
            cached is not None
            and keys.stable is not None
            and cached.stable == keys.stable
        )
        kept = slot.tokens if conversation else keys.stable_tokens if stable else 0
        # The server would copy the slot to its host prompt cache first: the smaller the better.
        copies = bool(slot.tokens) and kept < KEEP_MIN * slot.tokens
        copy_rank = -slot.tokens if copies else 1
        reserved = index < self._reserved
        foreground = lane.foreground
        # A slot whose cache a foreground request left is worth keeping; background and
        # automation take it last.
        keeps_foreground = (
            slot.lane is not None
            and slot.lane.foreground
            and not (conversation or stable)
        )
        if foreground:
            return (
                int(own),
                conversation,
                stable,
                int(settled),
                copy_rank,
                int(reserved),
                int(not keeps_foreground),
            )
        # Background avoids what a foreground request left warm first, then the reserved slots.
        return (
            int(not keeps_foreground),
            int(not reserved),
            int(own),
            conversation,
            # A short prefix shared with a long slot is worth less than the copy it causes.
            stable and int(not copies),
            int(settled),
            copy_rank,
        )


class SlotPlacer:
    """Places a scheduler's attempts on the server's slots, where the server lets clients choose.

    Where it does not (``Backend.chooses_slots`` false, or the slot count unknown) it places
    nothing and requests go as they are.
    """

    __slots__ = ("_backend", "_latencies", "table")

    def __init__(self, backend: Backend) -> None:
        """Place on ``backend``'s slots once ``resize`` knows how many there are."""
        self._backend = backend
        self.table: SlotTable | None = None
        self._latencies: deque[float] = deque(maxlen=LATENCIES_KEPT)

    def resize(self, settings: SchedulerSettings, learned_headroom: int) -> None:
        """Follow the settings and the headroom learned: the slots used and those reserved."""
        slots = settings.server_slots
        if not (self._backend.chooses_slots and slots and settings.slot_placement):
            self.table = None
            return
        used = min(slots, max(settings.max_sequences, 1))
        headroom = max(settings.headroom, learned_headroom)
        reserved = max(1, min(headroom, used - 1)) if used > 1 else 0
        if self.table is None:
            self.table = SlotTable(used, reserved)
        else:
            self.table.resize(used, reserved)

    def only_spare_free(self, now: float) -> bool:
        """Whether the only free slots hold voice's last warm copies (``SlotTable``)."""
        return self.table is not None and self.table.only_spare_free(now)

    def keys_for(self, request: ChatRequest) -> PrefixKeys | None:
        """Return what the slot table matches a request by (None: the server places it)."""
        return prefix_keys(request) if self.table is not None else None

    def place(self, ticket: Ticket, request: ChatRequest, now: float) -> ChatRequest:
        """Put an attempt on its slot (where the server lets us choose)."""
        if self.table is None or ticket.keys is None:
            return request
        queued = ticket.queued
        slot = self.table.assign(
            queued.seq, queued.lane, ticket.keys, previous=ticket.slot, now=now
        )
        if slot is None:
            return request
        ticket.slot = slot
        return replace(request, slot=slot)

    def free(self, ticket: Ticket, now: float, *, cancelled: bool) -> None:
        """Give back the slot an attempt held."""
        if self.table is not None:
            queued = ticket.queued
            self.table.release(
                queued.seq,
                now,
                cancelled=cancelled,
                tokens=queued.prompt_tokens + queued.output_tokens,
            )

    async def settled(self, index: int | None, now: float) -> None:
        """Wait until the server has let go of the slot an attempt names.

        A slot freed by a cancellation is busy at the server until it notices the closed
        stream; a task naming it there would be deferred behind it (and on llama.cpp with a host
        prompt cache, copy it first). The server's ``/slots`` says when it is free (at most
        ``CANCEL_SETTLE_S`` is waited); a server that does not report its slots is sent the task
        at once. How long the server took is kept (``cancel_latency_s``).
        """
        table = self.table
        if table is None or index is None or not table.unsettled(index, now):
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + CANCEL_SETTLE_S
        while loop.time() < deadline:
            try:
                busy = await self._backend.busy_slots()
            except BackendError:
                break
            if busy is None:
                table.settle(index)
                return
            if index not in busy:
                break
            await asyncio.sleep(SETTLE_POLL_S)
        self._latencies.append(table.since_freed(index, now) + loop.time() - start)
        table.settle(index)

    @property
    def cancel_latency_s(self) -> float | None:
        """How long the server takes to free a cancelled slot (median of the latest; None: unknown)."""
        return statistics.median(self._latencies) if self._latencies else None
