"""One run of a job: the request it sends, where it sends it, and the answer it streams back.

A job runs on its server's scheduler (``SchedulerRoute``), or where the household's pool puts it
(a ``JobRoute`` of ``household.py``: a server that can be woken is woken for it, and a job for
the pool runs on whichever server of the background lane serves it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Protocol

import homeassistant.util.dt as dt_util

from custom_components.llm_lanes.core.errors import (
    AuthError,
    LanesError,
    LimitExceededError,
    ModelNotFoundError,
    QuotaExceededError,
    ToolsUnsupportedError,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest, StreamChunk
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.jobs.model import Job, JobAnswer

NON_RETRYABLE_ERRORS: tuple[type[LanesError], ...] = (
    LimitExceededError,
    QuotaExceededError,
    ModelNotFoundError,
    AuthError,
    ToolsUnsupportedError,
)
"""Errors that another attempt would meet again."""


def job_request(job: Job, model: str) -> ChatRequest:
    """Build the chat request a job sends: its system prompt and its prompt."""
    return ChatRequest(
        model=model,
        messages=(
            ChatMessage(role="system", content=job.system_prompt),
            ChatMessage(role="user", content=job.prompt),
        ),
        max_tokens=job.max_output_tokens,
    )


class JobRoute(Protocol):
    """Where a job's request goes."""

    def reachable(self, job: Job) -> bool:
        """Whether a server the job may run on answers now (or can be woken for it)."""

    def stream(self, job: Job, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Send the job's request in the background lane; iterate to run it."""


class SchedulerRoute:
    """A job on its own server's scheduler, while that server answers."""

    def __init__(self, scheduler: Scheduler, reachable: Callable[[], bool]) -> None:
        """Send to ``scheduler``; ``reachable`` says whether the server answers now."""
        self._scheduler = scheduler
        self._reachable = reachable

    def reachable(self, job: Job) -> bool:
        """Whether the server answers now."""
        return self._reachable()

    def stream(self, job: Job, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Queue the job's request at the scheduler."""
        return self._scheduler.stream(
            request,
            lane=Lane.BACKGROUND,
            requester=job.requester,
            prompt_tokens=job.prompt_tokens_estimate,
        )


async def async_stream_answer(route: JobRoute, job: Job, model: str) -> JobAnswer:
    """Stream the job's answer through the background lane; raise what the route raises."""
    parts: list[str] = []
    answer = JobAnswer(
        text="", prompt_tokens=0, output_tokens=0, token_source=None, ttft_s=None
    )
    started = dt_util.utcnow()
    first_token_at: datetime | None = None
    stream = route.stream(job, job_request(job, model))
    try:
        async for chunk in stream:
            if chunk.text:
                if first_token_at is None:
                    first_token_at = dt_util.utcnow()
                parts.append(chunk.text)
                answer.output_tokens += chunk.output_tokens
            if chunk.usage is not None:
                answer.prompt_tokens = chunk.usage.prompt_tokens
                answer.output_tokens = chunk.usage.output_tokens
                answer.token_source = chunk.usage.source
    finally:
        # Closing the stream cancels the request at the server and frees its slot.
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    answer.text = "".join(parts)
    if first_token_at is not None:
        answer.ttft_s = (first_token_at - started).total_seconds()
    return answer
