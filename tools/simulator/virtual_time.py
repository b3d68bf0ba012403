"""An asyncio event loop on virtual time: sleeping costs nothing, and nothing is random.

When no callback is ready, the loop jumps its clock to the next timer instead of waiting, so a
workload of minutes (a scheduler in front of the simulated engine, whose iterations are
``asyncio.sleep`` calls) runs in the time its callbacks take, the same way every run. There is no
I/O: the selector only moves the clock. Use it with ``asyncio.Runner(loop_factory=VirtualTimeLoop)``
and read the time with ``loop.time()``.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _ClockSelector(selectors.BaseSelector):
    """A selector with nothing to select: waiting ``timeout`` moves the loop's clock instead."""

    def __init__(self) -> None:
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualTimeLoop | None = None

    def register(
        self, fileobj: Any, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, id(fileobj), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(
        self, timeout: float | None = None
    ) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError(
                "virtual time: nothing is scheduled and nothing can happen"
            )
        assert self.loop is not None
        self.loop.advance(timeout)
        return []

    def get_map(self) -> dict[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The event loop whose ``time()`` is virtual (see the module docstring)."""

    def __init__(self) -> None:
        """Start at time 0 with a selector that moves the clock."""
        selector = _ClockSelector()
        self._now = 0.0
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        """Return the virtual time, in seconds since the loop was made."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the selector does, instead of waiting)."""
        self._now += max(0.0, seconds)
