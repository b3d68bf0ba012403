"""One pool request's journey: its arrival, each attempt on a server, its failovers, its end.

A failure before the first token moves the request on silently; one in the middle of an answer
moves what was streamed so far to the next server as an assistant prefix, which continues it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NotRequired, TypedDict

from custom_components.llm_lanes.core.errors import (
    AuthError,
    BackendConnectionError,
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
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk, TokenUsage
from custom_components.llm_lanes.core.pool_members import Member
from custom_components.llm_lanes.core.router import PromptShape
from custom_components.llm_lanes.core.snapshot import FinishedRequest

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
