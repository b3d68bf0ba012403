"""One pool request's journey: its arrival, each attempt on a server, its failovers, its end.

A failure before the first token moves the request on silently; one in the middle of an answer
moves what was streamed so far to the next server as an assistant prefix, which continues it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
import logging
from typing import NotRequired, TypedDict

from custom_components.llm_lanes.core.errors import (
    AuthError,
    BackendConnectionError,
    BackendHTTPError,
    BackendTimeoutError,
    MalformedStreamError,
    ModelNotFoundError,
    QueueFullError,
    SchedulerClosedError,
    ServerBusyError,
    StreamClosedError,
    ToolsUnsupportedError,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.metrics import request_itl_p95
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk, TokenUsage
from custom_components.llm_lanes.core.pool_members import Member
from custom_components.llm_lanes.core.router import PromptShape
from custom_components.llm_lanes.core.scheduler import Submission
from custom_components.llm_lanes.core.snapshot import FinishedRequest

_LOGGER = logging.getLogger(__name__)

MOVE_AND_MARK_DOWN: tuple[type[Exception], ...] = (
    BackendConnectionError,
    BackendTimeoutError,
    StreamClosedError,
    AuthError,
    SchedulerClosedError,
)
"""Failures of the server itself: the request moves on and the server is down until it answers."""
MOVE_ON: tuple[type[Exception], ...] = (
    ServerBusyError,
    QueueFullError,
    ModelNotFoundError,
    ToolsUnsupportedError,
    MalformedStreamError,
    TimeoutError,
)
"""Failures another server may not have (busy, full, a model or feature it lacks, a stall)."""


class PoolSubmission(TypedDict):
    """What a caller says of a request besides the request itself (``Scheduler``'s, and more)."""

    lane: Lane
    requester: str
    prompt_tokens: NotRequired[int | None]
    deadline_s: NotRequired[float | None]
    server: NotRequired[str | None]
    """Run on this server only (no failover); None: wherever the pool routes it."""


class Journey:
    """One pool request, from its arrival to its end, across the servers it ran on."""

    __slots__ = (
        "arrived_at",
        "attempts",
        "deadline_s",
        "expected_ttft_s",
        "failed",
        "failovers",
        "first_token_at",
        "gaps",
        "lane",
        "last_token_at",
        "max_tokens",
        "output_tokens",
        "parts",
        "path",
        "prompt_tokens",
        "records",
        "request",
        "requester",
        "resumed_on",
        "seq",
        "server",
        "shape",
        "sink",
        "submitted_at",
        "tool_calls_sent",
        "tried",
    )

    def __init__(
        self,
        seq: int,
        request: ChatRequest,
        how: PoolSubmission,
        *,
        shape: PromptShape,
        now: float,
        sink: list[FinishedRequest] | None,
    ) -> None:
        """Open the journey of a request as it arrives at the pool."""
        self.seq = seq
        self.request = request
        self.lane = how["lane"]
        self.requester = how["requester"]
        self.prompt_tokens = how.get("prompt_tokens")
        self.deadline_s = how.get("deadline_s")
        self.server = how.get("server")
        self.shape = shape
        self.sink = sink
        self.arrived_at = now
        self.submitted_at = now
        """When the latest attempt was sent to its server's scheduler."""
        self.max_tokens: int | None = request.max_tokens
        self.tried: set[str] = set()
        self.expected_ttft_s = 0.0
        """What the router expected of the current attempt's first token."""
        self.failed: Exception | None = None
        """The latest failure that moved it on (raised if no server is left)."""
        self.failovers = 0
        self.resumed_on: str | None = None
        self.parts: list[str] = []
        self.output_tokens = 0
        self.tool_calls_sent = False
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.gaps: list[float] = []
        self.records: list[tuple[str, FinishedRequest]] = []
        """(server, record) of every attempt that reached a member's scheduler."""
        self.path: list[str] = []
        """The server of every attempt, in order."""
        self.attempts: list[FinishedRequest] = []
        """Where the current attempt's scheduler puts its record (``ServerPool.is_attempt``)."""

    def attempt(self, member: Member) -> ChatRequest | None:
        """Return what the next attempt sends to ``member``; None when no output is left to make."""
        request = self.request
        model = member.candidate.capabilities.model_for(request)
        assert model is not None  # the router only offers servers that serve it
        if self.max_tokens is None:
            limits = member.scheduler.settings.lanes[self.lane]
            self.max_tokens = limits.default_output_tokens
        if not self.parts:
            return replace(request, model=model, max_tokens=self.max_tokens)
        remaining = self.max_tokens - self.output_tokens
        if remaining <= 0:
            return None
        return replace(
            request,
            model=model,
            assistant_prefix=request.assistant_prefix + "".join(self.parts),
            max_tokens=remaining,
        )

    def took(self, chunk: StreamChunk, now: float) -> None:
        """Note a chunk handed to the caller."""
        self.output_tokens += chunk.output_tokens
        if chunk.text:
            self.parts.append(chunk.text)
        if chunk.tool_calls:
            self.tool_calls_sent = True
        if chunk.output_tokens or chunk.text or chunk.tool_calls:
            if self.first_token_at is None:
                self.first_token_at = now
            elif self.last_token_at is not None:
                self.gaps.append(now - self.last_token_at)
            self.last_token_at = now

    def final(self, chunk: StreamChunk, attempt_output: int) -> StreamChunk:
        """Return the last chunk for the caller, its usage the whole request's (resumed or not)."""
        if self.resumed_on is None:
            return chunk
        usage = chunk.usage
        before = self.output_tokens - attempt_output
        output = (
            before + usage.output_tokens
            if usage is not None and usage.source == "server"
            else self.output_tokens
        )
        return replace(
            chunk,
            usage=TokenUsage(
                self.records[0][1].prompt_tokens if self.records else self.shape.tokens,
                output,
                usage.source if usage is not None else "estimate",
            ),
        )

    def went_to(self, member: Member, previous: Member | None) -> bool:
        """Note the server of the next attempt; return whether the request moved to it."""
        member.candidate.recent.note(self.shape.keys)
        self.path.append(member.name)
        if previous is None or previous is member:
            return False
        self.failovers += 1
        if self.parts:
            self.resumed_on = member.name
            member.resumed_total += 1
        return True

    def submission(self, now: float) -> Submission:
        """Return what the next attempt tells its server's scheduler besides the request."""
        prompt = (
            self.prompt_tokens
            if self.prompt_tokens is not None
            else self.shape.tokens  # the scheduler's own estimate, worked out once
        )
        if self.parts:
            prompt += self.output_tokens  # the kept output is prompt now
        deadline = self.deadline_s
        if deadline is not None:
            deadline = max(0.0, deadline - (now - self.arrived_at))
        return {
            "lane": self.lane,
            "requester": self.requester,
            "prompt_tokens": prompt,
            "deadline_s": deadline,
        }

    def failed_on(
        self, member: Member, failure: Exception | None, *, closed: bool
    ) -> None:
        """Judge an attempt that failed on ``member``: mark it, raise unless another may go on."""
        if failure is None:
            failure = StreamClosedError("the server's stream ended without an answer")
        marks_down = isinstance(failure, MOVE_AND_MARK_DOWN) or (
            isinstance(failure, BackendHTTPError)
            and failure.status >= 500
            and not isinstance(failure, ServerBusyError)
        )
        if marks_down:
            member.availability.failed()
        movable = marks_down or isinstance(failure, MOVE_ON)
        if not movable or closed or self.server is not None or self.tool_calls_sent:
            raise failure
        member.failures_total += 1
        self.tried.add(member.name)
        _LOGGER.info(
            "request %s failed on %s (%s); moving it to the next server",
            self.seq,
            member.name,
            type(failure).__name__,
        )
        self.failed = failure

    def ended(
        self, member: Member, records: list[FinishedRequest], chunk: StreamChunk
    ) -> None:
        """Learn from an attempt that answered to its end on ``member``."""
        self.records.extend((member.name, record) for record in records)
        member.served_total += 1
        if records:
            member.candidate.observed.learn(records[-1], chunk.usage)

    def record(
        self, member: Member | None, outcome: str, error: str | None, now: float
    ) -> FinishedRequest:
        """Return the request's one record, timed from its arrival at the pool."""
        last = self.records[-1][1] if self.records else None
        lane = last.lane if last is not None else self.lane
        limits = (
            member.scheduler.settings.lanes[lane]
            if member is not None and lane in member.scheduler.settings.lanes
            else lane.defaults
        )
        ttft = (
            None
            if self.first_token_at is None
            else self.first_token_at - self.arrived_at
        )
        itl_p95 = request_itl_p95(self.gaps)
        queue_wait = (
            self.submitted_at - self.arrived_at + last.queue_wait_s
            if last is not None
            else now - self.arrived_at
        )
        return FinishedRequest(
            request_id=f"pool-{self.seq}",
            lane=lane,
            requester=self.requester,
            outcome=outcome,
            error=error,
            queue_wait_s=queue_wait,
            ttft_s=ttft,
            itl_p95_s=itl_p95,
            itl_max_s=max(self.gaps) if self.gaps else None,
            e2e_s=now - self.arrived_at,
            prompt_tokens=self.records[0][1].prompt_tokens
            if self.records
            else self.shape.tokens,
            output_tokens=self.output_tokens
            if self.resumed_on is not None or last is None
            else last.output_tokens,
            token_source=last.token_source if last is not None else "estimate",
            preemptions=sum(r.preemptions for _, r in self.records),
            met_ttft=ttft is not None and ttft <= limits.ttft_slo_s,
            met_itl=outcome != "rejected"
            and (itl_p95 is None or itl_p95 <= limits.itl_slo_s),
            server=member.name if member is not None else None,
            failovers=self.failovers,
            resumed_on=self.resumed_on,
            path=tuple(self.path),
        )


async def next_chunk(
    chunks: AsyncIterator[StreamChunk],
    journey: Journey,
    *,
    first: bool,
    stall_s: float,
    alternative: Callable[[], bool],
) -> StreamChunk:
    """Return the next chunk of an attempt; an urgent lane's stall raises TimeoutError.

    An urgent request stalls when its server sends nothing for ``stall_s`` beyond the first token
    the router expected, or between two chunks, while another server that may serve it is up
    (``alternative``); with none up it keeps waiting here, and looks again every ``stall_s``.
    """
    try:
        if not journey.lane.urgent:
            return await anext(chunks)
        limit = stall_s + journey.expected_ttft_s if first else stall_s
        pending = asyncio.ensure_future(anext(chunks))
        try:
            while True:
                done, _ = await asyncio.wait((pending,), timeout=limit)
                if done:
                    return pending.result()
                if alternative():
                    raise TimeoutError
                limit = stall_s
        finally:
            if not pending.done():
                pending.cancel()
                await asyncio.wait((pending,))
    except StopAsyncIteration:
        raise StreamClosedError(
            "the scheduler ended the stream before it said it was done"
        ) from None
