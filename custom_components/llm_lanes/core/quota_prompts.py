"""What a quota requester's prompt will be charged, known before the request is admitted.

A quota holds within one request only if every request reserves at least what the server will
charge it. Our estimate (``tokens.py``) does not see the chat template: on a real llama-server
with Qwen 2.5's template a chat estimated at 9 prompt tokens was charged 38 (its default system
prompt and role markers), and a burst passed a 2,000-token quota by a third. So, for a requester
with a quota (and only for one: nobody else waits for a count):

- where the server counts prompts (``Backend.counts_prompts``: llama.cpp, vLLM), it counts this
  one with its own template and tokenizer before admission: the reservation is exact;
- elsewhere, or when the count fails, the prompt is bounded: from what the server reported for
  this requester's recent prompts of the same shape (with or without tools), scaled up to a
  longer estimate, or before any report by a presumed ``4 x estimate + 256`` (four times denser
  text than we assume, and a template of 256 tokens).

A bound may still be wrong, so admission lets a bounded request that would cross the quota run
in the requester's lane only when none of its other requests is in flight (``admission.py``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass
import logging

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.errors import BackendError
from custom_components.llm_lanes.core.model import ChatRequest

_LOGGER = logging.getLogger(__name__)

COUNT_TIMEOUT_S = 5.0
"""The longest a count may take (local calls answered by the server's HTTP threads, in
milliseconds even while every slot is busy); past it the prompt is bounded."""
PRESUMED_FACTOR = 4
"""A prompt never seen is presumed at most this many times our estimate (dense text)..."""
PRESUMED_TEMPLATE_TOKENS = 256
"""...plus this many tokens of chat template (system prompt, role markers, tool instructions)."""
REPORTS_KEPT = 8
"""Reports kept per requester and shape (the most recent)."""
SHAPES_KEPT = 256
"""Requesters and shapes remembered per server (the least recently reported go first)."""


@dataclass(frozen=True, slots=True)
class QuotaPrompt:
    """What a request's prompt reserves of its requester's quota."""

    tokens: int
    counted: bool
    """Counted by the server (exact), rather than bounded."""


def presumed_bound(estimate: int) -> int:
    """Bound a prompt that nothing is known of, from our estimate."""
    return PRESUMED_FACTOR * max(estimate, 1) + PRESUMED_TEMPLATE_TOKENS


type _Shape = tuple[str, bool]


class QuotaPrompts:
    """The prompts of quota requesters at one server: counted there, or bounded from its reports."""

    __slots__ = ("_backend", "_reports")

    def __init__(self, backend: Backend) -> None:
        """Count and learn at ``backend``'s server."""
        self._backend = backend
        self._reports: OrderedDict[_Shape, deque[tuple[int, int]]] = OrderedDict()

    async def reserve(
        self, request: ChatRequest, requester: str, estimate: int
    ) -> QuotaPrompt:
        """Return what ``request``'s prompt reserves: the server's count, or a bound of it."""
        if self._backend.counts_prompts:
            try:
                async with asyncio.timeout(COUNT_TIMEOUT_S):
                    counted = await self._backend.count_prompt_tokens(request)
            except (BackendError, TimeoutError) as err:
                _LOGGER.debug("counting a prompt failed (%s); bounding it instead", err)
            else:
                if counted is not None:
                    return QuotaPrompt(max(counted, 1), counted=True)
        return self.bounded(request, requester, estimate)

    def bounded(
        self, request: ChatRequest, requester: str, estimate: int
    ) -> QuotaPrompt:
        """Bound a prompt from the reports of the requester's prompts of its shape.

        A report of ``r`` tokens for a prompt estimated at ``e`` bounds a prompt estimated at
        ``E`` by ``r`` when ``E <= e`` and by ``r * E / e`` when longer: whatever the template
        adds and however dense the text, as long as both are as in the report. The most cautious
        recent report wins: a report can be low (Ollama leaves out what it took from its cache).
        """
        reports = self._reports.get((requester, bool(request.tools)))
        if not reports:
            return QuotaPrompt(presumed_bound(estimate), counted=False)
        estimate = max(estimate, 1)
        return QuotaPrompt(
            max(
                reported if estimate <= seen else -(-reported * estimate // seen)
                for seen, reported in reports
            ),
            counted=False,
        )

    def learn(
        self, request: ChatRequest, requester: str, estimate: int, reported: int
    ) -> None:
        """Keep what the server reported for a prompt we estimated at ``estimate``."""
        if reported <= 0:
            return
        shape = (requester, bool(request.tools))
        reports = self._reports.get(shape)
        if reports is None:
            reports = self._reports[shape] = deque(maxlen=REPORTS_KEPT)
            if len(self._reports) > SHAPES_KEPT:
                self._reports.popitem(last=False)
        else:
            self._reports.move_to_end(shape)
        reports.append((max(estimate, 1), reported))
