"""The continuous-batching engine model behind the simulated server.

One loop runs iterations like llama.cpp's ``update_slots`` or vLLM's scheduler step:

* up to ``slots`` sequences run at once; further requests wait in one first-come-first-served
  queue (only its head may be admitted, as in the real servers);
* an iteration prefills up to ``prefill_chunk_tokens`` prompt tokens (all of every waiting prompt
  when it is None) and decodes one token for every sequence whose prompt is done;
* it lasts what ``EngineCosts.pass_seconds`` says (``costs.py``: a fixed part, the prompt tokens
  above a floor, the decoding sequences), divided by ``speed``; every task launched blocks the loop
  ``task_overhead_s`` more;
* the KV cache holds ``kv_capacity_tokens``; when decoding outgrows it, the most recently
  admitted sequence is preempted (its cache dropped, as vLLM's recompute preemption does) and
  goes back to the head of the queue, to prefill its prompt and its output again;
* a cancelled sequence (client gone) leaves its slot at once, or, with ``cancel_notice_s``, goes
  on decoding (its tokens dropped) until the server notices, as llama-server does at its next
  token write or within a second;
* every slot keeps the prompt (and the answer) of the last sequence it served, as llama.cpp's
  slots do: a sequence placed on it prefills only what its prompt does not share with that cache.
  A request may name its slot (llama.cpp's ``id_slot``; it waits for that slot); otherwise the
  engine picks the free slot whose cache shares most of the prompt when that is at least
  ``SIMILARITY_THRESHOLD`` of it (llama.cpp's ``--slot-prompt-similarity``), else the free slot
  used least recently. Ollama's runner also reuses the longest cached prefix among its slots.
  A request naming a busy slot is deferred, the others behind it go on;
* with ``costs.host_cache``, llama-server's host prompt cache (``host_cache.py``): a request that
  keeps less than ``KEEP_THRESHOLD`` of its slot's content, takes a slot by least-recent use or
  named a busy one saves that slot first and loads a saved prompt that it shares more with (at
  least ``LOAD_THRESHOLD`` of that saved prompt; the entry moves into the slot); at every
  launch each idle slot whose content changed is saved (``--cache-idle-slots``). The loop is
  blocked meanwhile: nothing decodes.

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

from tools.simulator.costs import (
    COSTS,
    CPU_COSTS,
    GPU_COSTS,
    EngineCosts,
    HostCacheCosts,
)
from tools.simulator.host_cache import HostCache, common_prefix

SIMILARITY_THRESHOLD = 0.1
"""The share of a prompt a slot's cache must hold for the engine to pick that slot for it."""
KEEP_THRESHOLD = 0.5
"""A request keeping less than this share of its slot's content saves that content first."""
LOAD_THRESHOLD = 0.25
"""A saved prompt is loaded only when the new prompt shares at least this share of it."""

__all__ = [
    "COSTS",
    "CPU_COSTS",
    "GPU_COSTS",
    "Engine",
    "EngineCosts",
    "HostCacheCosts",
    "Sequence",
    "common_prefix",
]


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
    deferred: bool = False
    """It named a slot that was busy."""
    prefill_only: bool = False
    """Evaluate the prompt into the slot's cache and end (llama.cpp ``/completion`` with
    ``n_predict: 0``: one token is sampled, in the prompt's last pass)."""
    cached_prompt_tokens: int = 0
    """Prompt tokens the slot's cache held when the sequence was admitted (last admission)."""

    @property
    def context(self) -> int:
        """Prompt plus output so far: what must be in the cache to decode the next token."""
        return self.prompt_tokens + self.generated


@dataclass(slots=True)
class EngineStats:
    """Running totals, read by ``/metrics``, ``/slots`` and the fidelity report."""

    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    decode_iterations_total: int = 0
    busy_slots_sum: int = 0
    preemptions_total: int = 0
    requests_total: int = 0
    cancelled_total: int = 0
    launches_total: int = 0
    """Tasks launched on a slot (chats and prefill steps)."""
    prefill_steps_total: int = 0
    prefill_step_tokens_total: int = 0
    """Prompt tokens the prefill steps evaluated."""
    saves_total: int = 0
    loads_total: int = 0
    host_cache_seconds_total: float = 0.0
    """The loop blocked by the host prompt cache's copies."""
    blocked_seconds_total: float = 0.0
    """The loop blocked between iterations: the copies and the tasks' overhead."""


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
        self.slot_tokens: list[int] = [0] * slots
        """How many tokens each slot's cache holds."""
        self.slot_saved: list[bool] = [True] * slots
        """Whether each slot's content is in the host cache (or there is nothing to save)."""
        self.host_cache = (
            HostCache(costs.host_cache.capacity_tokens)
            if costs.host_cache is not None
            else None
        )
        self._slot_used: list[float] = [0.0] * slots
        self._blocked_s = 0.0
        """What the launches since the last iteration cost the loop."""
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
        """Drop a sequence (its client went away).

        A waiting one goes at once; a running one frees its slot at once, or after
        ``costs.cancel_notice_s`` (it decodes on meanwhile, its tokens dropped).
        """
        if seq.finished or seq.cancelled:
            return
        seq.cancelled = True
        self.stats.cancelled_total += 1
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running and self.costs.cancel_notice_s > 0:
            asyncio.get_running_loop().call_later(
                self.costs.cancel_notice_s / self.speed, self._drop, seq
            )
            return
        self._drop(seq)

    def _drop(self, seq: Sequence) -> None:
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
            if self._blocked_s > 0:
                # Launching tasks (and the host cache's copies) hold the loop: nothing decodes.
                blocked, self._blocked_s = self._blocked_s, 0.0
                self.stats.blocked_seconds_total += blocked
                await asyncio.sleep(blocked / self.speed)
            if not self.running:
                if self.waiting:
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
                head.deferred = True
                deferred.append(self.waiting.popleft())
                continue
            self.waiting.popleft()
            by_recent_use = False
            if head.want_slot is not None:
                slot = head.want_slot
            else:
                slot, by_recent_use = self._pick(head, free)
            self._launch(head, slot, by_recent_use=by_recent_use)
        self.waiting.extendleft(reversed(deferred))

    def _launch(self, seq: Sequence, slot: int, *, by_recent_use: bool) -> None:
        self.stats.launches_total += 1
        self._blocked_s += self.costs.task_overhead_s
        if self.host_cache is not None:
            self._swap(seq, slot, by_recent_use=by_recent_use)
        cached = self._cached_tokens(seq, slot)
        seq.slot = slot
        seq.cached_prompt_tokens = cached
        seq.prefill_remaining = seq.context - cached
        seq.cached = cached
        self._slot_used[slot] = self._clock()
        self.running.append(seq)
        if self.host_cache is not None:
            self._save_idle_slots()

    def _swap(self, seq: Sequence, slot: int, *, by_recent_use: bool) -> None:
        """Save the slot's content first, then load a better match (the host cache at a launch)."""
        cache, costs = self.host_cache, self.costs.host_cache
        assert cache is not None and costs is not None
        content = self.slot_cache[slot]
        kept = common_prefix(seq.prompt_text, content) if seq.prompt_text else 0
        losing = bool(content) and kept < KEEP_THRESHOLD * len(content)
        if not (by_recent_use or seq.deferred or losing):
            return
        self._save(slot)
        found = cache.best(seq.prompt_text) if seq.prompt_text else None
        if found is None:
            return
        entry, shared = found
        # Worth it only for a prompt that shares more than the slot keeps, and enough of the entry.
        if shared <= kept or shared < LOAD_THRESHOLD * len(entry.text):
            return
        # The entry moves into the slot (llama.cpp erases it from the cache).
        cache.take(entry)
        self.slot_cache[slot] = entry.text
        self.slot_tokens[slot] = entry.tokens
        self.slot_saved[slot] = False
        self.stats.loads_total += 1
        self._block_for_cache(costs.load_seconds(entry.tokens))

    def _save_idle_slots(self) -> None:
        costs = self.costs.host_cache
        assert costs is not None
        if not costs.idle_slots:
            return
        busy = {seq.slot for seq in self.running}
        for slot in range(self.slots):
            if slot not in busy:
                self._save(slot)

    def _save(self, slot: int) -> None:
        """Save a slot's content if it changed since it was saved (and the cache lacks it)."""
        cache, costs = self.host_cache, self.costs.host_cache
        assert cache is not None and costs is not None
        if self.slot_saved[slot]:
            return
        self.slot_saved[slot] = True
        if cache.save(self.slot_cache[slot], self.slot_tokens[slot]):
            self.stats.saves_total += 1
            self._block_for_cache(costs.save_seconds(self.slot_tokens[slot]))

    def _block_for_cache(self, seconds: float) -> None:
        self._blocked_s += seconds
        self.stats.host_cache_seconds_total += seconds

    def _pick(self, seq: Sequence, free: list[int]) -> tuple[int, bool]:
        """Pick the free slot whose cache holds most of the prompt, else the least recently used.

        Returns the slot and whether it was picked by least-recent use.
        """
        if seq.prompt_text:
            shared, best = max(
                (common_prefix(seq.prompt_text, self.slot_cache[i]), -i) for i in free
            )
            if shared >= SIMILARITY_THRESHOLD * len(seq.prompt_text):
                return -best, False
        return min(free, key=lambda i: self._slot_used[i]), True

    def _cached_tokens(self, seq: Sequence, slot: int) -> int:
        """Prompt tokens the slot's cache saves this sequence (at least one is always evaluated)."""
        content = self.slot_cache[slot]
        self.slot_cache[slot] = ""  # overwritten from here on
        self.slot_tokens[slot] = 0
        self.slot_saved[slot] = True
        if not seq.prompt_text:
            return 0
        text = seq.prompt_text
        shared = common_prefix(text, content)
        return min(seq.context - 1, seq.prompt_tokens * shared // len(text))

    async def _iterate(self) -> None:
        budget = self.prefill_chunk_tokens
        prefilled = 0
        prompts = 0
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
                prompts += 1
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
        costs = self.costs
        seconds = costs.pass_seconds(prefilled, prompts, decoding)
        await asyncio.sleep(seconds / self.speed)
        self.stats.prompt_tokens_total += prefilled
        if prefilled:
            self.stats.prompt_seconds_total += seconds - (
                costs.pass_seconds(0, 0, decoding) if decoding else 0.0
            )
        if decoding:
            self.stats.decode_iterations_total += 1
            self.stats.busy_slots_sum += len(self.running)
            self.stats.tokens_predicted_seconds_total += seconds
        for seq in done_prefilling:
            emitting.remove(seq)
            if seq in self.running:
                self.stats.prefill_steps_total += 1
                self.stats.prefill_step_tokens_total += (
                    seq.prompt_tokens - seq.cached_prompt_tokens
                )
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
            self.slot_tokens[seq.slot] = seq.context if done else 0
            self.slot_saved[seq.slot] = not done
        if seq.slot is not None:
            # llama.cpp stamps a slot's last use when it is released.
            self._slot_used[seq.slot] = self._clock()
        seq.slot = None
        seq.cached = 0
        seq.tokens.put_nowait(None)
