"""The callbacks of the entities that follow something that changes (the pool, the jobs)."""

from __future__ import annotations

from homeassistant.core import CALLBACK_TYPE, callback


class Listeners:
    """Callbacks to call on every change; each stays until the callback ``add`` returned is called."""

    def __init__(self) -> None:
        """Start with no listener."""
        self._listeners: list[CALLBACK_TYPE] = []

    @callback
    def add(self, listener: CALLBACK_TYPE) -> CALLBACK_TYPE:
        """Call ``listener`` on every change, until the returned callback removes it."""
        self._listeners.append(listener)

        @callback
        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    @callback
    def changed(self) -> None:
        """Call every listener (one removed by an earlier one's call is still called this time)."""
        for listener in tuple(self._listeners):
            listener()
