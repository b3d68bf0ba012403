"""Whether a pool's server can take work now, and what wakes it, probes it and puts it to sleep.

A server of a pool is in one of four states (``ServerState``):

- ``up``: it takes requests;
- ``down``: it failed (refused a connection, answered 5xx, timed out) or was reported down; it is
  probed every ``probe_s`` seconds with its health check and is up again at the first answer;
- ``asleep``: put to sleep (by the pool after ``idle_sleep_s`` idle seconds, or reported so);
  nothing is sent to it until it is woken;
- ``waking``: its ``wake`` action ran (from ``asleep``, or from ``down``: a sleeping desktop
  looks like a server that is down) and its health check is polled every ``probe_s`` seconds, for
  at most ``wake_limit_s``; every request waiting for it shares that one wake, and if the limit
  passes it is in its earlier state again.

Waking and sleeping are data and callbacks (``PowerControl``): the Home Assistant side binds them to
entities (a ``wake_on_lan`` button, a switch). Timing comes from ``clock``; waits and timers run on
the event loop (``clock_rate`` clock seconds per loop second, as ``Scheduler`` takes it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
import contextlib
from dataclasses import dataclass
from enum import StrEnum
import logging
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend

_LOGGER = logging.getLogger(__name__)

type Action = Callable[[], Awaitable[None]]
type HealthCheck = Callable[[], Awaitable[bool]]

PROBE_S = 3.0
"""How often a server that is down or waking is asked whether it answers (the polls' pace while
a server does not answer)."""
HEALTH_TIMEOUT_S = 5.0
"""The longest one health check may take; longer is a failed check."""
DEFAULT_WAKE_LIMIT_S = 180.0
"""How long a woken server is given to answer (a desktop resuming and loading its model)."""


class ServerState(StrEnum):
    """What a pool's server can do now (see the module docstring)."""

    UP = "up"
    DOWN = "down"
    ASLEEP = "asleep"
    WAKING = "waking"


_WAKEABLE = frozenset({ServerState.ASLEEP, ServerState.DOWN})
"""States a wake action is tried from: a sleeping desktop often looks like a server that is down."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerControl:
    """How a server is woken and put to sleep."""

    wake: Action | None = None
    """Starts the server (presses a Wake-on-LAN button); it answers some time later."""
    sleep: Action | None = None
    """Puts the server to sleep."""
    wake_limit_s: float = DEFAULT_WAKE_LIMIT_S
    """How long a woken server is given to answer its health check."""
    idle_sleep_s: float | None = None
    """After its work and this many idle seconds it is put to sleep (None: never)."""


def answers(backend: Backend) -> HealthCheck:
    """Return a health check that the server lists its models."""

    async def check() -> bool:
        await backend.list_models()
        return True

    return check


class Availability:
    """One server's state in a pool and the transitions of the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        health: HealthCheck,
        power: PowerControl,
        busy: Callable[[], bool],
        clock: Callable[[], float],
        clock_rate: float = 1.0,
        probe_s: float = PROBE_S,
        state: ServerState = ServerState.UP,
    ) -> None:
        """Start in ``state``; ``busy`` says whether a request waits or runs on the server."""
        self.name = name
        self.power = power
        self._health = health
        self._busy = busy
        self._clock = clock
        self._clock_rate = clock_rate if clock_rate > 0 else 1.0
        self._probe_s = probe_s
        self._state = state
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waking: asyncio.Task[bool] | None = None
        self._probing: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_activity = clock()
        self._hold_until = float("-inf")
        self._closed = False

    @property
    def state(self) -> ServerState:
        """The state now."""
        return self._state

    @property
    def can_wake(self) -> bool:
        """Whether the server has a wake action."""
        return self.power.wake is not None

    # --- what the pool and the Home Assistant side report -----------------------------------------

    def report(self, state: ServerState) -> None:
        """Take a state seen from outside (a poll answered, a sleep entity's state)."""
        if self._closed or state is self._state:
            return
        if state is ServerState.WAKING:
            self.wake_soon()
            return
        self._set(state)
        if state is ServerState.UP:
            self.activity()

    def failed(self) -> None:
        """Mark the server down after a request found it failing, until a probe finds it answering."""
        if self._state is ServerState.UP:
            _LOGGER.info("%s failed a request; probing it until it answers", self.name)
            self._set(ServerState.DOWN)

    def activity(self) -> None:
        """Note work on the server (a request ended); its idle time starts again."""
        self._last_activity = self._clock()
        self._arm_sleep()

    def set_power(self, power: PowerControl) -> None:
        """Take another way of waking and sleeping the server; its idle timer follows it."""
        self.power = power
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._arm_sleep()

    def hold(self, until: float) -> None:
        """Keep the server awake until ``until`` (a command was announced for it)."""
        self._hold_until = max(self._hold_until, until)
        self._arm_sleep()

    # --- waking ---------------------------------------------------------------------------------

    def wake_soon(self) -> None:
        """Start waking the server (if it sleeps) without waiting for it."""
        if self._closed or not self.can_wake:
            return
        if self._state in _WAKEABLE and self._waking is None:
            self._waking = self._spawn(self._wake)

    async def awake(self) -> bool:
        """Wake the server if it sleeps and wait for it; return whether it is up now.

        False when it has no wake action, is down, or did not answer within the wake limit.
        Cancelling the caller does not stop the wake for the others waiting.
        """
        if self._state is ServerState.UP:
            return True
        self.wake_soon()
        waking = self._waking
        if waking is None:
            return False
        return await asyncio.shield(waking)

    async def _wake(self) -> bool:
        assert self.power.wake is not None
        limit = self.power.wake_limit_s
        started = self._clock()
        before = self._state
        self._set(ServerState.WAKING)
        _LOGGER.info("waking %s (up to %.0f s)", self.name, limit)
        try:
            try:
                async with asyncio.timeout(limit / self._clock_rate):
                    await self.power.wake()
            except Exception:  # noqa: BLE001 - a failed wake is logged; the limit still applies
                _LOGGER.warning("waking %s failed", self.name, exc_info=True)
            while True:
                left = started + limit - self._clock()
                if self._state is ServerState.UP or await self._healthy(left):
                    self._set(ServerState.UP)
                    self.activity()
                    return True
                left = started + limit - self._clock()
                if left <= 0:
                    break
                await asyncio.sleep(min(self._probe_s, left) / self._clock_rate)
            _LOGGER.warning("%s did not wake within %.0f s", self.name, limit)
            if self._state is ServerState.WAKING:
                self._set(before)
            return False
        finally:
            self._waking = None

    # --- probing a server that is down ------------------------------------------------------------

    async def _probe(self) -> None:
        try:
            while self._state is ServerState.DOWN:
                await asyncio.sleep(self._probe_s / self._clock_rate)
                if self._state is ServerState.DOWN and await self._healthy(
                    HEALTH_TIMEOUT_S
                ):
                    # Whoever reported it down says it is back (Home Assistant's poll).
                    _LOGGER.debug("%s answers again", self.name)
                    self._set(ServerState.UP)
                    self.activity()
        finally:
            self._probing = None

    async def _healthy(self, limit_s: float) -> bool:
        try:
            async with asyncio.timeout(
                max(min(limit_s, HEALTH_TIMEOUT_S), 0.0) / self._clock_rate
            ):
                return await self._health()
        except Exception:  # noqa: BLE001 - any failure of the check means "not answering"
            return False

    # --- sleeping -------------------------------------------------------------------------------

    def _arm_sleep(self) -> None:
        """Put the server to sleep once it has been idle long enough (and nothing holds it)."""
        idle_s = self.power.idle_sleep_s
        if (
            self._closed
            or self.power.sleep is None
            or idle_s is None
            or self._state is not ServerState.UP
        ):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # outside the loop: armed at the next activity
        if self._timer is not None:
            self._timer.cancel()
        due = max(self._last_activity + idle_s, self._hold_until)
        delay = max(0.0, due - self._clock()) / self._clock_rate
        self._timer = loop.call_later(delay, self._idle_check)

    def _idle_check(self) -> None:
        self._timer = None
        if self._state is not ServerState.UP or self._busy():
            return  # the end of its work notes activity and arms the timer again
        idle_s = self.power.idle_sleep_s
        assert idle_s is not None
        if self._clock() < max(self._last_activity + idle_s, self._hold_until):
            self._arm_sleep()
            return
        self._spawn(self._sleep)

    async def _sleep(self) -> None:
        assert self.power.sleep is not None
        _LOGGER.info("putting %s to sleep after its idle time", self.name)
        self._set(ServerState.ASLEEP)
        try:
            await self.power.sleep()
        except Exception:  # noqa: BLE001 - it may still be up: probed like a failed server
            _LOGGER.warning("putting %s to sleep failed", self.name, exc_info=True)
            if self._state is ServerState.ASLEEP:
                self._set(ServerState.DOWN)

    # --- state ----------------------------------------------------------------------------------

    def _set(self, state: ServerState) -> None:
        self._state = state
        if state is not ServerState.UP and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if state is ServerState.DOWN and self._probing is None and not self._closed:
            with contextlib.suppress(RuntimeError):  # no loop: the next report probes
                self._probing = self._spawn(self._probe)

    def _spawn[T](self, work: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Task[T]:
        loop = (
            asyncio.get_running_loop()
        )  # before the coroutine exists: none is left unawaited
        task = loop.create_task(work(), name=f"llm_lanes pool {self.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Stop probing, waking and the idle timer."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
