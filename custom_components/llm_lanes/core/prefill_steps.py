"""Long background prompts prefilled into their server slot in steps, where the steps pay.

A server that prefills a whole prompt at once (llama.cpp evaluates up to ``--batch-size`` tokens
in one uninterruptible pass) makes a voice command that arrives meanwhile wait for all of it.
Where the server can prefill a prompt into a chosen slot's cache ahead of the request that uses it
(``Backend.prefills_in_steps``: llama.cpp's ``/apply-template`` and ``/completion`` with
``n_predict`` 0), a long background prompt may be prefilled in steps instead, and a command waits
for one step at most.

A step is not free. Each is a task: its HTTP round trip, template and tokenization, a pass whose
cost has a floor (on a GPU a pass of 40 tokens costs what one of 250 does), a sampled token, and on
a llama-server with a host prompt cache (``--cache-ram``, on by default since late 2025) the copy
of every idle slot whose content changed, which blocks the server's loop. ``PrefillCost`` learns a
step's fixed cost and its cost per server token apart (a two-size probe, then a robust line through
the steps' wall times), and a prompt is stepped only where that pays: where a step of
``prefill_step_s`` at most halves what voice would wait behind the whole prompt (or behind the
server's own ``--batch-size`` chunk of it), and its fixed cost is at most a quarter of the step.
On a CPU server (no floor, cheap copies) that is every long prompt; on a GPU with a host prompt
cache, none. One request steps at a time, so steps never go in lockstep.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
import logging
import statistics

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.errors import BackendHTTPError
from custom_components.llm_lanes.core.model import ChatRequest
from custom_components.llm_lanes.core.run_state import RunState
from custom_components.llm_lanes.core.ticket import Ticket
from custom_components.llm_lanes.core.tokens import CHARS_PER_TOKEN

_LOGGER = logging.getLogger(__name__)

SAMPLES_KEPT = 32
"""Recent steps the costs are learned from (the probes age out, and the costs are probed again)."""
PROBE_TOKENS = (128, 384)
"""Server tokens of the two probe steps that tell the fixed cost from the marginal one."""
MIN_SPREAD = 1.5
"""Two steps tell the marginal cost when one is at least this many times the other."""
FIXED_SHARE_MAX = 0.25
"""A step is made long enough that its fixed cost is at most this share of it."""
SERVER_BATCH_TOKENS = 2048
"""llama.cpp's default ``--batch-size``: a prompt is evaluated in passes of at most this many
tokens, and a task sent meanwhile waits for one pass, not for the whole prompt."""


class PrefillCost:
    """A prefill step's cost at one server: fixed, and per server token, learned from the steps.

    ``seconds`` of a step is its whole wall time as the scheduler saw it (the round trip, the task,
    the pass with whatever shared it, any prompt-cache copy the task's launch caused), and its
    tokens are the server's own count of what it evaluated: its tokenizer and its template, not our
    estimate.
    """

    __slots__ = ("_chars", "_fit", "_samples", "_tokens")

    def __init__(self) -> None:
        """Know nothing of the server yet."""
        self._samples: deque[tuple[int, float]] = deque(maxlen=SAMPLES_KEPT)
        self._chars = 0
        self._tokens = 0
        self._fit: tuple[float, float] | tuple[()] | None = None
        """The costs fitted to the samples (empty: they cannot be); None: not yet fitted."""

    def observe(self, tokens: int, seconds: float, chars: int) -> None:
        """Record a step that evaluated ``tokens`` server tokens of ``chars`` new characters."""
        if tokens > 0 and seconds > 0:
            self._samples.append((tokens, seconds))
            self._tokens += tokens
            self._chars += max(chars, 0)
            self._fit = None

    @property
    def tokens_observed(self) -> int:
        """Server tokens the steps evaluated so far."""
        return self._tokens

    def chars_per_token(self) -> float:
        """Characters of rendered prompt per server token (our estimate's until measured)."""
        if self._tokens < 2 * PROBE_TOKENS[0] or self._chars <= 0:
            return float(CHARS_PER_TOKEN)
        return self._chars / self._tokens

    def fit(self) -> tuple[float, float] | None:
        """Return (fixed seconds, seconds per token) of a step; None before sizes apart are seen.

        Theil-Sen: the slope is the median of the slopes between steps of sizes at least
        ``MIN_SPREAD`` apart, the fixed cost the median residual, so a step stalled by a copy
        moves neither much.
        """
        if self._fit is None and len(self._samples) >= 2:
            self._fit = _theil_sen(self._samples)
        return self._fit or None

    def tokens_per_s(self) -> float | None:
        """Return the marginal prefill speed learned, in our estimate's tokens (None: unknown).

        The router multiplies it with prompts counted by our estimate (``tokens.py``).
        """
        fit = self.fit()
        if fit is None:
            return None
        return self.chars_per_token() / CHARS_PER_TOKEN / fit[1]

    def step_tokens(self, prompt: float, step_s: float) -> int | None:
        """Server tokens a step of a prompt of ``prompt`` tokens should take.

        None: send it whole with the request (the steps do not pay for it, or it is short).
        While the costs are unknown the steps probe two sizes.
        """
        fit = self.fit()
        if fit is None:
            probe = PROBE_TOKENS[len(self._samples) % len(PROBE_TOKENS)]
            return probe if probe < prompt / 2 else None
        fixed, per_token = fit
        step = max(step_s, fixed / FIXED_SHARE_MAX - fixed) / per_token
        whole_wait = fixed + per_token * min(prompt, SERVER_BATCH_TOKENS)
        if step >= prompt or fixed + per_token * step > whole_wait / 2:
            return None
        return round(step)


def _theil_sen(samples: deque[tuple[int, float]]) -> tuple[float, float] | tuple[()]:
    slopes = [
        (s2 - s1) / (n2 - n1)
        for i, (n1, s1) in enumerate(samples)
        for n2, s2 in list(samples)[i + 1 :]
        if max(n1, n2) >= MIN_SPREAD * min(n1, n2)
    ]
    if not slopes:
        return ()
    slope = max(statistics.median(slopes), 1e-7)
    fixed = max(0.0, statistics.median(s - slope * n for n, s in samples))
    return fixed, slope


class PrefillSteps:
    """Prefills the long prompts of yielding lanes into their slot, step by step, one at a time."""

    __slots__ = ("_backend", "_clock", "_turn", "cost")

    def __init__(self, backend: Backend, clock: Callable[[], float]) -> None:
        """Prefill through ``backend`` (where it can), timing the steps on ``clock``."""
        self._backend = backend
        self._clock = clock
        self._turn = asyncio.Lock()
        self.cost = PrefillCost()

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
        request is marked ``stepping`` from its first step (``RunState.begin_steps``), which keeps
        it from being preempted for voice. If it is preempted all the same (by the headroom or the
        slots), what was prefilled stays cached on its slot for its resumption. A server that
        refuses the endpoints (404, 405, 501) is sent prompts whole from then on. Return whether
        any step was made (the caller then sends the request once ``quiet`` too).
        """
        backend = self._backend
        step_s = state.settings.prefill_step_s
        queued = ticket.queued
        if (
            not backend.prefills_in_steps
            or step_s <= 0
            or request.slot is None
            or not queued.lane.yields
            or self.cost.step_tokens(queued.prompt_tokens, step_s) is None
        ):
            return False
        try:
            async with self._turn:
                return await self._steps(request, state, ticket, quiet, step_s)
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

    async def _steps(
        self,
        request: ChatRequest,
        state: RunState,
        ticket: Ticket,
        quiet: asyncio.Event,
        step_s: float,
    ) -> bool:
        assert request.slot is not None  # checked by run
        text = await self._backend.render_prompt(request)
        done = 0
        size: int | None = None
        probing = True
        while True:
            per_token = self.cost.chars_per_token()
            remaining = (len(text) - done) / per_token
            if probing:
                probing = self.cost.fit() is None
                size = self.cost.step_tokens(remaining, step_s)
            if size is None or remaining <= size:
                return done > 0
            cut = done + round(size * per_token)
            await quiet.wait()
            state.begin_steps(ticket.queued)
            started = self._clock()
            result = await self._backend.prefill(
                request.model, text[:cut], request.slot
            )
            state.task_launched()
            self.cost.observe(
                result.evaluated_tokens, self._clock() - started, cut - done
            )
            done = cut
