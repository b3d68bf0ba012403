"""What one scheduler shows the router of its server: a read-only view of its load and costs.

A pool (``pool.py``) routes each request to the server where its caller will get the first token
soonest and the tokens fastest (``router.py``). It reads each member scheduler through this view,
never its internals, and never changes what the scheduler learns: the queues and the running
requests (``run_state.py``), the headroom kept for the foreground (``foreground.py``), the prompt
prefixes the server's free slots hold (``slots.SlotTable``), the learned batch-cost curve
(``batch_cost.BatchCostModel``) and the learned prefill speed (``prefill_steps.PrefillCost``).
Every read is a few additions: a routing decision reads several servers within 0.2 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from custom_components.llm_lanes.core.foreground import Foreground
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.prefill_steps import PrefillCost
from custom_components.llm_lanes.core.prompt_prefixes import PrefixKeys
from custom_components.llm_lanes.core.run_state import RunState
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.slots import SlotPlacer


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """A scheduler's state as routing reads it (``Scheduler.load``); it changes nothing."""

    state: RunState
    foreground: Foreground
    slots: SlotPlacer
    prefill_cost: PrefillCost

    @property
    def settings(self) -> SchedulerSettings:
        """The scheduler's settings in force."""
        return self.state.settings

    @property
    def busy(self) -> bool:
        """Whether a request waits or runs there."""
        return bool(self.state.waiting or self.state.in_flight)

    @property
    def in_flight(self) -> int:
        """Sequences running at the server now."""
        return self.state.in_flight

    def waiting_ahead(self, lane: Lane) -> int:
        """Count the waiting requests a new one of ``lane`` would wait behind (its lane and above)."""
        queued = self.state.queued_by_lane
        return sum(
            queued[other] for other in self.state.lanes if other.rank <= lane.rank
        )

    def open_slots(self, lane: Lane, now: float) -> int:
        """Slots a new request of ``lane`` could take now.

        A foreground request takes back the slots of background streams when preemption is on;
        the others leave the headroom to the foreground while it is active.
        """
        state = self.state
        settings = state.settings
        free = max(settings.max_sequences, 1) - state.in_flight
        if lane.foreground:
            if settings.preemption:
                free += state.running_in(state.yielding_lanes)
        elif self.foreground.active(state, now):
            free -= self.foreground.headroom_slots(state)
        return max(free, 0)

    def itl_s(self, sequences: int, now: float) -> float | None:
        """Return the learned inter-token gap with ``sequences`` in flight (None: nothing learned)."""
        return self.foreground.cost_model.itl(sequences, now)

    def prefill_tok_s(self) -> float | None:
        """Return the prefill speed learned from prompts prefilled in steps (None: none was)."""
        return self.prefill_cost.tokens_per_s()

    def holds(self, keys: PrefixKeys) -> tuple[bool, bool] | None:
        """Whether a free slot holds the conversation and the stable prefix of a request.

        None where the server places requests on its slots itself (nothing is known here).
        """
        table = self.slots.table
        return table.holds(keys) if table is not None else None
