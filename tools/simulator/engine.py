"""The continuous-batching engine model behind the simulated server.

One loop runs iterations like llama.cpp's ``update_slots`` or vLLM's scheduler step:

* up to ``slots`` sequences run at once; further requests wait in one first-come-first-served
  queue (only its head may be admitted, as in the real servers);
* an iteration prefills up to ``prefill_chunk_tokens`` prompt tokens (all of every waiting prompt
  when it is None) and decodes one token for every sequence whose prompt is done;
* it lasts ``fixed_s + per_prefill_token_s * prefilled + per_decode_seq_s * decoding``, divided
  by ``speed``;
* the KV cache holds ``kv_capacity_tokens``; when decoding outgrows it, the most recently
  admitted sequence is preempted (its cache dropped, as vLLM's recompute preemption does) and
  goes back to the head of the queue, to prefill its prompt and its output again;
* a cancelled sequence (client gone) leaves its slot at once;
* every slot keeps the prompt (and the answer) of the last sequence it served, as llama.cpp's
  slots do: a sequence placed on it prefills only what its prompt does not share with that cache.
  A request may name its slot (llama.cpp's ``id_slot``; it waits for that slot); otherwise the
  engine picks the free slot whose cache shares most of the prompt when that is at least
  ``SIMILARITY_THRESHOLD`` of it (llama.cpp's ``--slot-prompt-similarity``), else the free slot
  used least recently. Ollama's runner also reuses the longest cached prefix among its slots.

Nothing here is random: the order of events depends only on the order of submissions.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
import contextlib
from dataclasses import dataclass, field
import itertools
import time

SIMILARITY_THRESHOLD = 0.1
"""The share of a prompt a slot's cache must hold for the engine to pick that slot for it."""


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCosts:
    """Cost model of one iteration, in seconds at ``speed == 1``.

    Defaults: a consumer GPU serving an 8B model at 4-bit with llama.cpp (decoding on the slow
    side of published figures, prompt processing mid-range). llama.cpp PR #15802 (RTX 3090,
    Llama 8B Q4_0) measures 155 tokens/s decoding one sequence and 469 tokens/s with four (6.5 ms
    and 8.5 ms an iteration); a community llama-bench report (dmatora/LLM-inference-speed-
    benchmarks #12, RTX 3080, Llama 3.1 8B Q4_K_M) gives 112 tokens/s generation and 3,807
    tokens/s prompt processing. Here one sequence decodes in 9.5 ms (105 tokens/s), four in 14 ms
    (286 tokens/s), and a prompt token costs 0.15 ms (6,700 tokens/s).
    """

    fixed_s: float = 0.008
    per_prefill_token_s: float = 0.00015
    per_decode_seq_s: float = 0.0015


GPU_COSTS = EngineCosts()
"""The defaults: a consumer GPU, on which four sequences cost 1.5x one."""
CPU_COSTS = EngineCosts(
    fixed_s=0.0002, per_prefill_token_s=0.000029, per_decode_seq_s=0.0011
)
"""A CPU server, shaped on the real llama-server of the tests (a tiny model, 2 threads): one
sequence decodes in 1.3 ms, two in 2.4 ms (1.85x), and a prompt token costs 29 us (34,500 tokens/s)."""
COSTS = {"gpu": GPU_COSTS, "cpu": CPU_COSTS}


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the engine."""

    id: int
    prompt_tokens: int
    max_new_tokens: int
    arrived_at: float
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    """Index of each new token as it is produced; None when the sequence ends."""
    generated: int = 0
    prefill_remaining: int = 0
    cached: int = 0
    """Tokens of this sequence in the KV cache."""
    slot: int | None = None
    preemptions: int = 0
    cancelled: bool = False
    finished: bool = False
    prompt_text: str = ""
    """The rendered prompt (what the prompt cache matches); empty: nothing to match."""
    pieces: tuple[str, ...] = ()
    """The answer's tokens (the slot's cache holds the prompt and what was generated)."""
    want_slot: int | None = None
    """The slot the request named (it waits for it)."""
    prefill_only: bool = False
    """Evaluate the prompt into the slot's cache and end (llama.cpp ``/completion`` with
    ``n_predict: 0``)."""
    cached_prompt_tokens: int = 0
    """Prompt tokens the slot's cache held when the sequence was admitted (last admission)."""

    @property
    def context(self) -> int:
        """Prompt plus output so far: what must be in the cache to decode the next token."""
        return self.prompt_tokens + self.generated


@dataclass(slots=True)
class EngineStats:
    """Running totals, read by ``/metrics`` and ``/slots``."""

    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    decode_iterations_total: int = 0
    busy_slots_sum: int = 0
    preemptions_total: int = 0
    requests_total: int = 0
    cancelled_total: int = 0


class Engine:
    """Slots, a FCFS queue and a KV cache, advanced one iteration at a time."""

    def __init__(
        self,
        *,
        slots: int,
        kv_capacity_tokens: int,
        prefill_chunk_tokens: int | None,
        costs: EngineCosts,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Configure the engine; call ``start`` inside a running event loop.

        ``clock`` stamps arrivals and slot use (a virtual-time event loop passes its own).
        """
        if slots < 1:
            raise ValueError("slots must be at least 1")
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.slots = slots
        self.kv_capacity_tokens = kv_capacity_tokens
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.costs = costs
        self.speed = speed
        self._clock = clock
        self.stats = EngineStats()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.slot_cache: list[str] = [""] * slots
        """What each slot's prompt cache holds (rendered text)."""
        self._slot_used: list[float] = [0.0] * slots
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the iteration loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="llm_lanes-sim-engine"
            )

    async def stop(self) -> None:
        """Stop the loop and end every sequence."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [*self.waiting, *self.running]:
            self._end(seq)
        self.waiting.clear()
        self.running.clear()

    # --- requests -------------------------------------------------------------------------------

    def submit(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        *,
        prompt_text: str = "",
        pieces: tuple[str, ...] = (),
        slot: int | None = None,
        prefill_only: bool = False,
    ) -> Sequence:
        """Queue a sequence; its tokens arrive on ``sequence.tokens``."""
        seq = Sequence(
            id=next(self._ids),
            prompt_tokens=max(1, prompt_tokens),
            max_new_tokens=max(0, max_new_tokens),
            arrived_at=self._clock(),
            prompt_text=prompt_text,
            pieces=pieces,
            want_slot=slot if slot is not None and 0 <= slot < self.slots else None,
            prefill_only=prefill_only,
        )
        self.stats.requests_total += 1
        if seq.max_new_tokens == 0 and not prefill_only:
            self._end(seq)
            return seq
        self.waiting.append(seq)
        self._wake.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Drop a sequence (its client went away); frees its slot and cache at once."""
        if seq.finished:
            return
        seq.cancelled = True
        self.stats.cancelled_total += 1
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self._end(seq)
        self._wake.set()

    # --- state for the HTTP layer ---------------------------------------------------------------

    @property
    def kv_used_tokens(self) -> int:
        """Tokens held in the KV cache now."""
        return sum(seq.cached for seq in self.running)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache in use."""
        return self.kv_used_tokens / self.kv_capacity_tokens

    def slot_table(self) -> list[Sequence | None]:
        """Return the sequence in each slot (None for an idle slot)."""
        table: list[Sequence | None] = [None] * self.slots
        for seq in self.running:
            if seq.slot is not None:
                table[seq.slot] = seq
        return table

    # --- the loop -------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._admit()
            if not self.running:
                # The head of the queue does not fit in an empty cache: it can never run.
                self._end(self.waiting.popleft())
                continue
            await self._iterate()

    def _admit(self) -> None:
        # A request naming a busy slot is deferred; the others behind it go on (llama.cpp).
        deferred: list[Sequence] = []
        while self.waiting and len(self.running) < self.slots:
            head = self.waiting[0]
            if self.kv_used_tokens + head.context + 1 > self.kv_capacity_tokens:
                break
            free = sorted({*range(self.slots)} - {seq.slot for seq in self.running})
            if head.want_slot is not None and head.want_slot not in free:
                deferred.append(self.waiting.popleft())
                continue
            self.waiting.popleft()
            slot = (
                head.want_slot if head.want_slot is not None else self._pick(head, free)
            )
            cached = self._cached_tokens(head, slot)
            head.slot = slot
            head.cached_prompt_tokens = cached
            head.prefill_remaining = head.context - cached
            head.cached = cached
            self._slot_used[slot] = self._clock()
            self.running.append(head)
        self.waiting.extendleft(reversed(deferred))

    def _pick(self, seq: Sequence, free: list[int]) -> int:
        """Pick the free slot whose cache holds most of the prompt, else the least recently used."""
        if seq.prompt_text:
            shared, best = max(
                (common_prefix(seq.prompt_text, self.slot_cache[i]), -i) for i in free
            )
            if shared >= SIMILARITY_THRESHOLD * len(seq.prompt_text):
                return -best
        return min(free, key=lambda i: self._slot_used[i])

    def _cached_tokens(self, seq: Sequence, slot: int) -> int:
        """Prompt tokens the slot's cache saves this sequence (at least one is always evaluated)."""
        if not seq.prompt_text:
            return 0
        text = seq.prompt_text
        shared = common_prefix(text, self.slot_cache[slot])
        self.slot_cache[slot] = ""  # overwritten from here on
        return min(seq.context - 1, seq.prompt_tokens * shared // len(text))

    async def _iterate(self) -> None:
        budget = self.prefill_chunk_tokens
        prefilled = 0
        emitting: list[Sequence] = []
        done_prefilling: list[Sequence] = []
        decoding = 0
        for seq in self.running:
            if seq.prefill_remaining > 0:
                take = (
                    seq.prefill_remaining
                    if budget is None
                    else min(seq.prefill_remaining, budget)
                )
                if take == 0:
                    continue
                seq.prefill_remaining -= take
                seq.cached += take
                prefilled += take
                if budget is not None:
                    budget -= take
                if seq.prefill_remaining == 0:
                    # The last prompt chunk's logits give the next token in the same pass.
                    emitting.append(seq)
                    if seq.prefill_only:
                        done_prefilling.append(seq)
            else:
                decoding += 1
                emitting.append(seq)
        seconds = (
            self.costs.fixed_s
            + self.costs.per_prefill_token_s * prefilled
            + self.costs.per_decode_seq_s * decoding
        )
        await asyncio.sleep(seconds / self.speed)
        self.stats.prompt_tokens_total += prefilled
        self.stats.prompt_seconds_total += (
            self.costs.per_prefill_token_s * prefilled
            + (self.costs.fixed_s if decoding == 0 else 0.0)
        )
        if decoding:
            self.stats.decode_iterations_total += 1
            self.stats.busy_slots_sum += len(self.running)
            self.stats.tokens_predicted_seconds_total += seconds
        for seq in done_prefilling:
            emitting.remove(seq)
            if seq in self.running:
                self.running.remove(seq)
                self._end(seq)
        for seq in emitting:
            if seq.cancelled or seq not in self.running:
                continue
            seq.generated += 1
            seq.cached += 1
            self.stats.tokens_predicted_total += 1
            seq.tokens.put_nowait(seq.generated - 1)
            if seq.generated >= seq.max_new_tokens:
                self.running.remove(seq)
                self._end(seq)
        self._preempt_if_full()

    def _preempt_if_full(self) -> None:
        # The next iteration adds one token per running sequence; make room for that.
        while (
            len(self.running) > 1
            and self.kv_used_tokens + len(self.running) > self.kv_capacity_tokens
        ):
            victim = self.running.pop()
            victim.slot = None
            victim.cached = 0
            victim.prefill_remaining = 0
            victim.preemptions += 1
            self.stats.preemptions_total += 1
            self.waiting.appendleft(victim)

    def _end(self, seq: Sequence) -> None:
        if seq.finished:
            return
        seq.finished = True
        if seq.slot is not None and seq.prompt_text:
            # What the slot evaluated stays cached: the prompt, and the answer so far.
            done = seq.prefill_remaining == 0
            self.slot_cache[seq.slot] = (
                seq.prompt_text + "".join(seq.pieces[: seq.generated]) if done else ""
            )
        seq.slot = None
        seq.cached = 0
        seq.tokens.put_nowait(None)
