"""What the scheduler knows of the foreground beyond its queues.

``Foreground`` is what the policy reads besides the run state, each fact with one owner:

- ``announced_until``: an urgent (voice) command announced by ``Scheduler.prepare`` before its
  text is known, until it arrives or the announcement lapses;
- ``headroom`` (``headroom.py``): the headroom the foreground needs, as learned from its prompts,
  and whether it may be lent to background;
- ``limiter`` (``batch_cost.py``): how many background streams may run beside active foreground
  work, from the learned batch-cost curve (``cost_model``), brought up to date before every
  decision;
- ``slots`` (``slots.py``): where the server lets clients choose slots, whether the only free
  slots are the last warm copies of voice's prompt (a typed chat then takes a slot from
  background instead).

It also answers the questions the rules share: is an urgent lane active, is the foreground active,
which foreground lanes are.
"""

from __future__ import annotations

from custom_components.llm_lanes.core.batch_cost import (
    BackgroundLimiter,
    BatchCostModel,
)
from custom_components.llm_lanes.core.headroom import HeadroomLearner
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.run_state import RunState
from custom_components.llm_lanes.core.slots import SlotPlacer

LEND_MAX_CANCEL_S = 0.1
"""The headroom is lent to background only while the server frees a cancelled slot this fast."""


class Foreground:
    """The foreground as one scheduler learns it (see the module docstring)."""

    __slots__ = ("announced_until", "cost_model", "headroom", "limiter", "slots")

    def __init__(self, max_sequences: int, slots: SlotPlacer | None = None) -> None:
        """Start knowing nothing of the server or of the household's foreground."""
        self.slots = slots
        self.cost_model = BatchCostModel(max(max_sequences, 8))
        self.limiter = BackgroundLimiter(self.cost_model)
        self.headroom = HeadroomLearner()
        self.announced_until = float("-inf")
        """Until when an urgent command is announced (``Scheduler.prepare``) but not arrived."""

    # --- what comes ----------------------------------------------------------------------------

    def arrived(self, state: RunState, lane: Lane, prompt_tokens: int) -> bool:
        """Note a new request of ``lane``; return whether the learned headroom changed."""
        if lane.urgent:
            self.announced_until = float("-inf")  # it came
        if not lane.foreground:
            return False
        lanes = state.foreground_lanes
        active = 1 + state.running_in(lanes) + state.queued_in(lanes)
        return self.headroom.observe(prompt_tokens, active, state.settings)

    def prepare(self, now: float, within_s: float) -> None:
        """Act as if an urgent request waited for ``within_s`` seconds (one was announced)."""
        self.announced_until = max(self.announced_until, now + within_s)

    def before_decisions(self, state: RunState, now: float) -> None:
        """Bring the learned background limit up to date."""
        foreground = state.foreground_lanes
        self.limiter.update(
            state.settings,
            foreground_running=state.running_in(foreground),
            foreground_waiting=state.queued_in(foreground),
            others_running=state.running_in(state.other_lanes),
            background_running=state.running_in(state.yielding_lanes),
            foreground_lanes=self.active_lanes(state, now),
            now=now,
        )

    # --- what the rules read -------------------------------------------------------------------

    def urgent_active(self, state: RunState, now: float) -> bool:
        """Whether an urgent lane waits, streams, or has been announced."""
        return now < self.announced_until or state.busy(state.urgent_lanes)

    def active(self, state: RunState, now: float) -> bool:
        """Whether an urgent lane is active or a foreground request waits or streams."""
        return self.urgent_active(state, now) or state.busy(state.foreground_lanes)

    def active_lanes(self, state: RunState, now: float) -> tuple[Lane, ...]:
        """Return the foreground lanes with a request waiting or streaming (urgent: or announced)."""
        announced = now < self.announced_until
        queued, running = state.queued_by_lane, state.running_by_lane
        return tuple(
            lane
            for lane in state.foreground_lanes
            if running[lane] or queued[lane] or (lane.urgent and announced)
        )

    def background_limit(self, state: RunState, now: float) -> int | None:
        """Return the most background streams allowed beside active foreground work (None: no limit).

        ``background_with_voice`` fixes it; otherwise it is what ``batch_cost.py`` learned.
        """
        if not self.active(state, now):
            return None
        fixed = state.settings.background_with_voice
        return fixed if fixed is not None else self.limiter.limit

    def lends_headroom(self) -> bool:
        """Whether background may borrow the headroom while the foreground is idle.

        Only while taking it back is cheap: the foreground's prompts are cheap to prefill again
        (a borrowed slot loses its cache) and the server frees a cancelled slot quickly (a
        llama-server copying slots to its host prompt cache may take most of a second, all of it
        voice's wait).
        """
        return self.headroom.lendable and self.cancels_quickly()

    def cancels_quickly(self) -> bool:
        """Whether the server lets go of a cancelled stream's slot within ``LEND_MAX_CANCEL_S``.

        A llama-server notices a closed stream at its next token write or within a second:
        meanwhile the stream decodes on in the batch (and its slot may be copied to the host
        prompt cache), so preempting it to lighten the batch beside voice gains nothing for that
        long. Where the scheduler places requests on slots it waits for a cancelled slot to be
        reported free and measures that (``SlotPlacer.cancel_latency_s``): such a server is
        taken as slow until a cancellation was measured quick (on the fitted GPU profile, the
        first cancellations of an evening otherwise cost voice a fifth of its p95). A server
        whose slots are not placed is not waited for, nor measured: it is taken as quick.
        """
        placer = self.slots
        if placer is None or placer.table is None:
            return True
        latency = placer.cancel_latency_s
        return latency is not None and latency <= LEND_MAX_CANCEL_S

    def only_voice_warm_slots_free(self, now: float) -> bool:
        """Whether the only free slots hold the last warm copies of an urgent lane's prompt."""
        return self.slots is not None and self.slots.only_spare_free(now)

    def headroom_slots(self, state: RunState) -> int:
        """Return the slots only the foreground may take: the setting, or what was learned if more."""
        max_sequences = max(state.settings.max_sequences, 1)
        return min(
            max(state.settings.headroom, self.headroom.slots, 0), max_sequences - 1
        )
