"""Long background prompts prefilled into their server slot in steps.

A server that prefills a whole batch at once (llama.cpp evaluates up to ``--batch-size`` tokens in
one uninterruptible pass) makes a voice command that arrives meanwhile wait for all of it. Where the
server can prefill a prompt into a chosen slot's cache ahead of the request that uses it
(``Backend.prefills_in_steps``: llama.cpp's ``/apply-template`` and ``/completion`` with
``n_predict`` 0), a long background prompt is therefore prefilled in steps of about
``prefill_step_s`` each, and a command waits one step at most; the step's size in tokens is learned
from the steps' own timings (``PrefillPacer``).
"""

from __future__ import annotations

import asyncio
from collections import deque
import logging
import statistics

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.errors import BackendHTTPError
from custom_components.llm_lanes.core.model import ChatRequest
from custom_components.llm_lanes.core.run_state import RunState
from custom_components.llm_lanes.core.ticket import Ticket

_LOGGER = logging.getLogger(__name__)

SAMPLES_KEPT = 64
"""Recent steps whose speed the step size follows."""
DEFAULT_STEP_TOKENS = 256
"""Prompt tokens per prefill step until the server's prefill speed is known."""
STEP_TOKENS_RANGE = (64, 4096)


class PrefillPacer:
    """How many prompt tokens one prefill step may take, learned from the steps' own timings.

    A server that prefills a whole batch at once (llama.cpp evaluates up to ``--batch-size``
    tokens in one uninterruptible pass) makes a voice command that arrives meanwhile wait for
    all of it. A long background prompt is therefore prefilled into its slot's cache in steps of
    about ``prefill_step_s`` each, so a command waits one step at most.
    """

    __slots__ = ("_rates",)

    def __init__(self) -> None:
        """Know nothing of the server's speed yet."""
        self._rates: deque[float] = deque(maxlen=SAMPLES_KEPT)

    def observe(self, tokens: int, seconds: float) -> None:
        """Record a step that evaluated ``tokens`` in ``seconds``."""
        if tokens >= 16 and seconds > 0:
            self._rates.append(tokens / seconds)

    def tokens_per_s(self) -> float | None:
        """Return the prefill speed learned (median of the recent steps); None before any step."""
        return statistics.median(self._rates) if self._rates else None

    def step_tokens(self, step_s: float) -> int:
        """Prompt tokens a step of ``step_s`` seconds takes at the speed learned."""
        if not self._rates:
            return DEFAULT_STEP_TOKENS
        low, high = STEP_TOKENS_RANGE
        return max(low, min(high, round(statistics.median(self._rates) * step_s)))


class PrefillSteps:
    """Prefills the long prompts of yielding lanes into their slot, step by step."""

    __slots__ = ("_backend", "pacer")

    def __init__(self, backend: Backend) -> None:
        """Prefill through ``backend`` (where it can)."""
        self._backend = backend
        self.pacer = PrefillPacer()

    async def run(
        self,
        ticket: Ticket,
        request: ChatRequest,
        state: RunState,
        quiet: asyncio.Event,
    ) -> bool:
        """Prefill a long background prompt into its slot before the request is sent.

        Each step waits for ``quiet`` (no urgent lane active), so a voice command waits for one
        step at most and its tokens never share an iteration with a background prefill; the
        request is marked ``stepping`` meanwhile (``RunState.begin_steps``), which keeps it from
        being preempted for voice. If it is preempted all the same (by the headroom or the slots),
        what was prefilled stays cached on its slot for its resumption. A server that refuses the
        endpoints (404, 405, 501) is sent prompts whole from then on. Return whether the prompt
        was prefilled in steps (the caller then sends the request once ``quiet`` too).
        """
        backend = self._backend
        step_s = state.settings.prefill_step_s
        queued = ticket.queued
        if (
            not backend.prefills_in_steps
            or step_s <= 0
            or request.slot is None
            or not queued.lane.yields
        ):
            return False
        step = self.pacer.step_tokens(step_s)
        steps = -(-queued.prompt_tokens // step)
        if steps < 2:
            return False
        state.begin_steps(queued)
        try:
            text = await backend.render_prompt(request)
            for index in range(1, steps):
                await quiet.wait()
                done = await backend.prefill(
                    request.model, text[: len(text) * index // steps], request.slot
                )
                self.pacer.observe(done.evaluated_tokens, done.seconds)
        except BackendHTTPError as err:
            if err.status not in {404, 405, 501}:
                raise
            _LOGGER.info(
                "%s cannot prefill in steps (HTTP %s); sending prompts whole",
                backend.base_url,
                err.status,
            )
            backend.prefills_in_steps = False
            return False
        return True
