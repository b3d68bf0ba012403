"""The servers a benchmark run replays a scenario over, how it stops and starts them, what each did.

A run goes to one server or to several (``scripts/bench run --server URL1 --server URL2``). Each is
a ``BenchServer``: its name (its number as a string, ``"1"`` for the first given: the scenario's
events and lane routes name servers by number), its client, what it said of itself, and where the
benchmark can stop and start it, its ``PowerSwitch`` (the simulator, the in-process engine, a
local process; ``tools/bench/servers.py`` makes them).

``Power`` is how a run uses a switch: one action at a time, ``kill`` and ``start`` each at most once
in a row (a second ``start`` of a running server does nothing), ``start`` done once the server
answers again, and the seconds it was off counted in its ``ServerTally``: what the server did in
the run (requests served per lane, tokens, failovers away from it and to it, time down or asleep
as the pool saw it), over the whole run, warm-up included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
import logging
from typing import Any

from custom_components.llm_lanes.core.backends.base import Backend

_LOGGER = logging.getLogger(__name__)

type Action = Callable[[], Awaitable[None]]

START_LIMIT_S = 180.0
"""How long (scenario seconds) a started server is given to answer before the start failed."""
POLL_S = 0.2
"""How often (scenario seconds) a started server is asked whether it answers."""


class ServerLostError(RuntimeError):
    """A server the run stopped did not answer again after it."""


@dataclass(frozen=True, slots=True)
class ServerDescription:
    """What a server says of itself (the ``server`` object of the report)."""

    kind: str
    version: str | None
    model: str
    slots: int | None
    context: int | None = None
    """Tokens one request may hold (prompt and answer), where the server says."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerSwitch:
    """How the benchmark stops and starts one server."""

    kill: Action
    """Stops it as a crash does (its streams break, new connections are refused)."""
    start: Action
    """Starts it again (it may answer some time later: ``Power`` waits for that)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchServer:
    """One server under test (see the module docstring)."""

    name: str
    backend: Backend
    description: ServerDescription
    switch: PowerSwitch | None = None
    """None: the benchmark cannot stop or start it (a scenario with events for it is refused)."""


@dataclass(slots=True)
class ServerTally:
    """What one server did during a run (see the module docstring)."""

    served: dict[str, int] = field(default_factory=dict)
    """Requests whose answer ended on it, per lane key."""
    served_since_start: int = 0
    """Those that ended after its latest ``start`` (all of them if it was never started again):
    whether routing came back to it."""
    prompt_tokens: int = 0
    """Prompt tokens of the attempts it answered, to the end or in part (the kept output of a
    resumed answer included)."""
    output_tokens: int = 0
    """Output tokens it produced, the parts of answers that failed over included."""
    failed_attempts: int = 0
    """Attempts that failed on it (moved on to another server, or failed their request)."""
    failovers_from: int = 0
    failovers_to: int = 0
    resumed_here: int = 0
    """Answers another server had begun that it continued (the pool only)."""
    kills: int = 0
    starts: int = 0
    off_s: float = 0.0
    """Seconds it was stopped (killed, or asleep until woken) until it answered again."""
    state_s: dict[str, float] | None = None
    """Seconds in each pool state (up, down, asleep, waking), as the pool saw it; None: no pool."""

    def serve(self, lane_key: str) -> None:
        """Count a request whose answer ended here."""
        self.served[lane_key] = self.served.get(lane_key, 0) + 1
        self.served_since_start += 1

    def as_dict(self) -> dict[str, Any]:
        """Return the report's figures of the server."""
        states = self.state_s
        return {
            "served": dict(self.served),
            "served_total": sum(self.served.values()),
            "served_since_start": self.served_since_start,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "failed_attempts": self.failed_attempts,
            "failovers_from": self.failovers_from,
            "failovers_to": self.failovers_to,
            "resumed_here": self.resumed_here,
            "kills": self.kills,
            "starts": self.starts,
            "off_s": self.off_s,
            "down_s": None if states is None else states.get("down", 0.0),
            "asleep_s": None if states is None else states.get("asleep", 0.0),
            "waking_s": None if states is None else states.get("waking", 0.0),
        }


class Power:
    """A run's hold on one server's switch (see the module docstring)."""

    def __init__(
        self,
        server: BenchServer,
        tally: ServerTally,
        *,
        now: Callable[[], float],
        time_scale: float,
        wake_delay_s: float = 0.0,
    ) -> None:
        """``now`` reads scenario seconds; loop waits are those divided by ``time_scale``."""
        if server.switch is None:
            raise ValueError(
                f"the benchmark cannot stop or start server {server.name} "
                f"({server.backend.base_url})"
            )
        self.server = server
        self._switch = server.switch
        self._tally = tally
        self._now = now
        self._scale = time_scale
        self._wake_delay_s = wake_delay_s
        self._lock = asyncio.Lock()
        self.running = True
        self._off_since: float | None = None

    async def kill(self) -> None:
        """Stop the server as a crash does (nothing if it is stopped)."""
        async with self._lock:
            if not self.running:
                return
            _LOGGER.info("killing server %s", self.server.name)
            await self._switch.kill()
            self.running = False
            self._off_since = self._now()
            self._tally.kills += 1

    async def start(self) -> None:
        """Start the server and return once it answers (nothing if it runs).

        A server that does not answer within ``START_LIMIT_S`` stays stopped (logged, not raised:
        the run goes on without it).
        """
        try:
            await self._start(counted=True)
        except Exception:  # noqa: BLE001 - a server that does not come back is a finding
            _LOGGER.warning("server %s did not start", self.server.name, exc_info=True)

    async def _start(self, *, counted: bool) -> None:
        async with self._lock:
            if self.running:
                return
            _LOGGER.info("starting server %s", self.server.name)
            await self._switch.start()
            await self._answering()
            self.running = True
            if counted:
                self._close_off()
                self._tally.starts += 1
                self._tally.served_since_start = 0

    async def wake(self) -> None:
        """Wake the server, as a pool asks: ``wake_delay_s`` (a machine resuming), then ``start``."""
        if self._wake_delay_s > 0:
            await asyncio.sleep(self._wake_delay_s / self._scale)
        await self.start()

    def count_off_from(self, at_s: float) -> None:
        """Count a stopped server's time off from ``at_s`` (the start of a run it sleeps at)."""
        if not self.running:
            self._off_since = at_s

    def finish(self) -> None:
        """Count the time off up to now (the end of the run)."""
        self._close_off()

    async def restore(self) -> None:
        """Start the server if the run left it stopped, without counting it (after the run).

        ``ServerLostError`` if it does not answer again: the runs after it would measure nothing.
        """
        self._off_since = None
        try:
            await self._start(counted=False)
        except Exception as err:
            raise ServerLostError(
                f"server {self.server.name} ({self.server.backend.base_url}) did not start "
                f"again after the run: {err}"
            ) from err

    def _close_off(self) -> None:
        if self._off_since is not None:
            self._tally.off_s += self._now() - self._off_since
            self._off_since = None

    async def _answering(self) -> None:
        """Wait until the server lists its models (TimeoutError past ``START_LIMIT_S``)."""
        deadline = self._now() + START_LIMIT_S
        while True:
            try:
                await self.server.backend.list_models()
            except Exception:  # noqa: BLE001 - whatever fails, it does not answer yet
                if self._now() >= deadline:
                    raise TimeoutError(
                        f"server {self.server.name} did not answer within {START_LIMIT_S:.0f} s"
                    ) from None
                await asyncio.sleep(POLL_S / self._scale)
            else:
                return
