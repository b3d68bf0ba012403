"""What the scheduler does for voice and typed chats beyond ordering them first.

``ForegroundCare`` keeps, for one server, what the policy needs to know of the foreground (voice
and interactive requests) and what the scheduler does on its behalf:

- the learned batch-cost curve and the background limit it gives (``batch_cost.py``), brought up
  to date before every decision;
- the headroom as the foreground needs it: while its prompts are long (Home Assistant's Assist
  prompt), a slot lent to background loses the prompt cached there, so the headroom is not lent,
  and it grows to as many slots as the most foreground requests found active at once among the
  latest ones (each keeps its own warm copy of the prompt), up to half the slots;
- an announced voice command (``prepare``);
- where the server lets clients choose, the slot every attempt runs on (``slots.py``), and long
  background prompts prefilled into their slot in steps (``PrefillPacer``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
import logging

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.batch_cost import (
    BackgroundLimiter,
    BatchCostModel,
    PrefillPacer,
    foreground_lanes,
)
from custom_components.llm_lanes.core.errors import BackendHTTPError
from custom_components.llm_lanes.core.lanes import FOREGROUND_LANES, Lane
from custom_components.llm_lanes.core.model import ChatRequest
from custom_components.llm_lanes.core.run_state import RunState
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.slots import PrefixKeys, SlotTable, prefix_keys
from custom_components.llm_lanes.core.ticket import Ticket

_LOGGER = logging.getLogger(__name__)

SAMPLES_KEPT = 32
"""Latest foreground requests whose prompt sizes and concurrency the headroom follows."""


class ForegroundCare:
    """Foreground bookkeeping of one scheduler (see the module docstring)."""

    __slots__ = (
        "_backend",
        "_concurrency",
        "_limiter",
        "_pacer",
        "_prompts",
        "cost_model",
        "slots",
    )

    def __init__(self, backend: Backend, settings: SchedulerSettings) -> None:
        """Start knowing nothing of the server or of the household's foreground."""
        self._backend = backend
        self.cost_model = BatchCostModel(max(settings.max_sequences, 8))
        self._limiter = BackgroundLimiter(self.cost_model)
        self._pacer = PrefillPacer()
        self._prompts: deque[int] = deque(maxlen=SAMPLES_KEPT)
        self._concurrency: deque[int] = deque(maxlen=SAMPLES_KEPT)
        self.slots: SlotTable | None = None

    # --- the foreground as it comes ----------------------------------------------------------------

    def arrived(
        self, state: RunState, settings: SchedulerSettings, lane: Lane, prompt: int
    ) -> None:
        """Note a new request: its prompt size and how many foreground requests it joins."""
        if lane is Lane.VOICE:
            state.voice_expected_until = float("-inf")  # it came
        if lane not in FOREGROUND_LANES:
            return
        running = state.running_by_lane
        self._prompts.append(prompt)
        self._concurrency.append(
            1
            + running[Lane.VOICE]
            + running[Lane.INTERACTIVE]
            + state.queued(Lane.VOICE)
            + state.queued(Lane.INTERACTIVE)
        )
        long_prompts = max(self._prompts) > settings.prefill_guard_tokens
        state.headroom_lendable = not long_prompts
        learned = 0
        if long_prompts:
            # Background keeps at least half the slots: it uses what is left, never starves.
            learned = min(max(self._concurrency), max(1, settings.max_sequences // 2))
        if learned != state.learned_headroom:
            state.learned_headroom = learned
            self.resize(state, settings)

    def prepare(self, state: RunState, now: float, within_s: float) -> None:
        """Act as if voice waited for ``within_s`` seconds (a command was announced)."""
        state.voice_expected_until = max(state.voice_expected_until, now + within_s)

    def before_decisions(
        self, state: RunState, settings: SchedulerSettings, now: float
    ) -> None:
        """Bring the learned background limit up to date."""
        running = state.running_by_lane
        state.learned_background_limit = self._limiter.update(
            settings,
            foreground_running=running[Lane.VOICE] + running[Lane.INTERACTIVE],
            foreground_waiting=state.queued(Lane.VOICE)
            + state.queued(Lane.INTERACTIVE),
            others_running=running[Lane.AUTOMATION],
            background_running=running[Lane.BACKGROUND],
            foreground_lanes=foreground_lanes(
                running,
                tuple(state.queued_by_lane),
                voice_expected=now < state.voice_expected_until,
            ),
            now=now,
        )

    # --- slots ---------------------------------------------------------------------------------

    def resize(self, state: RunState, settings: SchedulerSettings) -> None:
        """Place requests on the server's slots where it lets us (and says how many it has)."""
        slots = settings.server_slots
        if not self._backend.chooses_slots or not slots:
            self.slots = None
            return
        used = min(slots, max(settings.max_sequences, 1))
        headroom = max(settings.headroom, state.learned_headroom)
        reserved = max(1, min(headroom, used - 1)) if used > 1 else 0
        if self.slots is None:
            self.slots = SlotTable(used, reserved)
        else:
            self.slots.resize(used, reserved)

    def keys_for(self, request: ChatRequest) -> PrefixKeys | None:
        """Return what the slot table matches a request by (None: the server places it)."""
        return prefix_keys(request) if self.slots is not None else None

    def place(self, ticket: Ticket, request: ChatRequest, now: float) -> ChatRequest:
        """Put an attempt on its slot (where the server lets us choose)."""
        if self.slots is None or ticket.keys is None:
            return request
        queued = ticket.queued
        slot = self.slots.assign(
            queued.seq, queued.lane, ticket.keys, previous=ticket.slot, now=now
        )
        if slot is None:
            return request
        ticket.slot = slot
        return replace(request, slot=slot)

    def free(self, ticket: Ticket, now: float, *, cancelled: bool) -> None:
        """Give back the slot an attempt held."""
        if self.slots is not None:
            self.slots.release(ticket.queued.seq, now, cancelled=cancelled)

    async def prefill_in_steps(
        self, ticket: Ticket, request: ChatRequest, settings: SchedulerSettings
    ) -> None:
        """Prefill a long background prompt into its slot step by step (see ``PrefillPacer``).

        Between two steps a voice command joins the server's next iteration; if the request is
        preempted meanwhile, what was prefilled stays cached on its slot for its resumption.
        """
        backend = self._backend
        step_s = settings.prefill_step_s
        if (
            not backend.prefills_in_steps
            or step_s <= 0
            or request.slot is None
            or ticket.queued.lane is not Lane.BACKGROUND
        ):
            return
        step = self._pacer.step_tokens(step_s)
        steps = -(-ticket.queued.prompt_tokens // step)
        if steps < 2:
            return
        try:
            text = await backend.render_prompt(request)
            for index in range(1, steps):
                done = await backend.prefill(
                    request.model, text[: len(text) * index // steps], request.slot
                )
                self._pacer.observe(done.evaluated_tokens, done.seconds)
        except BackendHTTPError as err:
            if err.status not in {404, 405, 501}:
                raise
            _LOGGER.info(
                "%s cannot prefill in steps (HTTP %s); sending prompts whole",
                backend.base_url,
                err.status,
            )
            backend.prefills_in_steps = False
