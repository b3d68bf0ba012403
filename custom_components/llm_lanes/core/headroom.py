"""The headroom the foreground needs, learned from its own requests.

Home Assistant's Assist prompt (system prompt, exposed entities, tool schemas) is thousands of
tokens, and a server slot keeps the last prompt it served. While the foreground's prompts are that
long, a slot lent to background loses the prompt cached there, so the headroom is not lent; and it
grows to as many slots as the most foreground requests found active at once among the latest ones
(each keeps its own warm copy of the prompt), up to half the slots, so background always keeps the
other half.
"""

from __future__ import annotations

from collections import deque

from custom_components.llm_lanes.core.settings import SchedulerSettings

SAMPLES_KEPT = 32
"""Latest foreground requests whose prompt sizes and concurrency the headroom follows."""


class HeadroomLearner:
    """Follows the foreground's prompt sizes and concurrency (see the module docstring)."""

    __slots__ = ("_concurrency", "_prompts", "lendable", "slots")

    def __init__(self) -> None:
        """Start knowing nothing: no learned headroom, lendable."""
        self._prompts: deque[int] = deque(maxlen=SAMPLES_KEPT)
        self._concurrency: deque[int] = deque(maxlen=SAMPLES_KEPT)
        self.slots = 0
        """Slots the foreground is usually active on at once while its prompts are long; the
        headroom is at least this."""
        self.lendable = True
        """Whether background may borrow the headroom while the foreground is idle: only while
        the foreground's prompts are cheap to prefill again (a borrowed slot loses its cache)."""

    def observe(
        self, prompt_tokens: int, active: int, settings: SchedulerSettings
    ) -> bool:
        """Note a foreground arrival joining ``active`` foreground requests (itself included).

        Return whether the learned headroom changed.
        """
        self._prompts.append(prompt_tokens)
        self._concurrency.append(active)
        long_prompts = max(self._prompts) > settings.prefill_guard_tokens
        self.lendable = not long_prompts
        learned = 0
        if long_prompts and settings.learn_headroom:
            # Background keeps at least half the slots: it uses what is left, never starves.
            learned = min(max(self._concurrency), max(1, settings.max_sequences // 2))
        if learned == self.slots:
            return False
        self.slots = learned
        return True
