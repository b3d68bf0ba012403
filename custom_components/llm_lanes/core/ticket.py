"""One request inside the scheduler: its ticket, and the channel its answer reaches the caller by.

A ticket lives from submission to the request's end, across every attempt (a preempted request
is resumed on the same ticket). Its ``finished`` record is the one place a ``FinishedRequest``
is built, for requests that ran as for those refused at the door.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import replace

from custom_components.llm_lanes.core.lanes import LaneLimits
from custom_components.llm_lanes.core.metrics import GroupStats, request_itl_p95
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk
from custom_components.llm_lanes.core.prompt_prefixes import PrefixKeys
from custom_components.llm_lanes.core.run_state import QueuedRequest
from custom_components.llm_lanes.core.snapshot import FinishedRequest


class ChunkChannel:
    """Chunks (or a backend error) from the pumps to the caller, in order; ``fail`` jumps the line."""

    __slots__ = ("_error", "_items", "_waiter")

    def __init__(self) -> None:
        """Start empty."""
        self._items: deque[StreamChunk | BaseException] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    def put(self, item: StreamChunk | BaseException) -> None:
        """Hand the caller a chunk, or an error it raises after the chunks before it."""
        self._items.append(item)
        self._wake()

    def fail(self, error: BaseException) -> None:
        """Make the caller's next read raise ``error``, ahead of anything still queued."""
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> StreamChunk:
        """Wait for the next chunk (raising the error put or failed in its place)."""
        while True:
            if self._error is not None:
                raise self._error
            if self._items:
                item = self._items.popleft()
                if isinstance(item, BaseException):
                    raise item
                return item
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None


class Ticket:
    """Everything the scheduler tracks about one request between submission and its end."""

    __slots__ = (
        "admitted_at",
        "arrived_at",
        "attempt_live",
        "attempt_output",
        "attempt_prompt",
        "attempts",
        "batch_at_last_token",
        "launches_at_last_token",
        "cached_prompt",
        "evaluated_prompt",
        "channel",
        "counted_prompt",
        "counters",
        "first_token_at",
        "gaps",
        "keys",
        "lane_stats",
        "last_token_at",
        "left_queue_at",
        "original_prompt",
        "output_adjust",
        "parts",
        "preemptions",
        "pump",
        "queued",
        "record",
        "request",
        "requester_stats",
        "reserved",
        "sink",
        "slot",
        "token_source",
        "usage_prompt",
    )

    def __init__(
        self,
        *,
        queued: QueuedRequest,
        request: ChatRequest,
        counters: dict[str, float],
        lane_stats: GroupStats,
        requester_stats: GroupStats,
        sink: list[FinishedRequest] | None,
        keys: PrefixKeys | None = None,
    ) -> None:
        """Open a ticket for a request as it arrives."""
        self.queued = queued
        """Its place in the run state (what the policy sees)."""
        self.request = request
        self.arrived_at = queued.enqueued_at
        self.original_prompt = queued.prompt_tokens
        self.counters = counters
        """The fairness counters of its lane (charged per token)."""
        self.lane_stats = lane_stats
        self.requester_stats = requester_stats
        self.sink = sink
        """Where ``generate`` collects the finished record (None for streams)."""
        self.keys = keys
        """What its prompt shares with others (for slot placement; None: not placed)."""
        self.slot: int | None = None
        """The server slot its last attempt ran on."""
        self.channel = ChunkChannel()
        self.admitted_at: float | None = None
        self.left_queue_at: float | None = None
        """When it timed out of the queue (its wait ends there, not when the caller notices)."""
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.batch_at_last_token: int | None = None
        self.launches_at_last_token = -1
        """The server's task launches counted at the last token (``RunState.launches``)."""
        """Sequences the server decoded alone when its last token came (None: it prefilled too)."""
        self.gaps: list[float] = []
        self.parts: list[str] = []
        """The text streamed so far (sent back as the assistant prefix after a preemption)."""
        self.attempts = 0
        self.attempt_live: int | None = None
        """The attempt whose pump may still deliver chunks (None: none may)."""
        self.attempt_prompt = 0
        self.attempt_output = 0
        self.output_adjust = 0
        """Server-reported output tokens minus those counted while streaming."""
        self.usage_prompt: int | None = None
        self.cached_prompt = 0
        self.evaluated_prompt = 0
        """Prompt tokens earlier, preempted attempts took from the cache and evaluated."""
        self.token_source = "estimate"
        self.preemptions = 0
        self.reserved = 0
        """Quota tokens held for it while it waits and runs (its prompt and output limit)."""
        self.counted_prompt: int | None = None
        """Its prompt as the server counted it before admission (a quota requester's)."""
        self.pump: asyncio.Task[None] | None = None
        self.record: FinishedRequest | None = None

    def next_attempt(self) -> ChatRequest | None:
        """Return what the next attempt sends; None when nothing is left to generate.

        After a preemption it resumes: the text kept so far is the assistant prefix, and only
        the output tokens left are asked for.
        """
        request = self.request
        if not self.preemptions:
            return request
        assert request.max_tokens is not None  # set at submission
        remaining = request.max_tokens - self.queued.output_tokens
        if remaining <= 0:
            return None
        return replace(
            request,
            assistant_prefix=request.assistant_prefix + "".join(self.parts),
            max_tokens=remaining,
        )

    def requeued(self) -> None:
        """Take the kept output as prompt for the next attempt (after a preemption)."""
        self.queued.prompt_tokens = self.original_prompt + self.queued.output_tokens

    @property
    def prompt_tokens(self) -> int:
        """The request's prompt tokens: the server's count when it gave one, else the estimate."""
        return (
            self.usage_prompt if self.usage_prompt is not None else self.original_prompt
        )

    @property
    def output_tokens(self) -> int:
        """Output tokens over all attempts, corrected by the server's counts."""
        return self.queued.output_tokens + self.output_adjust

    def finished(
        self, now: float, outcome: str, error: str | None, limits: LaneLimits
    ) -> FinishedRequest:
        """Return the request's record as it leaves the scheduler; a rejected one met no objective."""
        queued = self.queued
        ttft = (
            None
            if self.first_token_at is None
            else self.first_token_at - self.arrived_at
        )
        itl_p95 = request_itl_p95(self.gaps)
        queue_left = now
        if self.admitted_at is not None:
            queue_left = self.admitted_at
        elif self.left_queue_at is not None:
            queue_left = self.left_queue_at
        return FinishedRequest(
            request_id=f"{queued.seq}",
            lane=queued.lane,
            requester=queued.requester,
            outcome=outcome,
            error=error,
            queue_wait_s=queue_left - self.arrived_at,
            ttft_s=ttft,
            itl_p95_s=itl_p95,
            itl_max_s=max(self.gaps) if self.gaps else None,
            e2e_s=now - self.arrived_at,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            token_source=self.token_source,
            preemptions=self.preemptions,
            met_ttft=ttft is not None and ttft <= limits.ttft_slo_s,
            met_itl=outcome != "rejected"
            and (itl_p95 is None or itl_p95 <= limits.itl_slo_s),
        )
