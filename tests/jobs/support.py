"""For the job tests: a scheduler whose load and streams the test scripts, and clock moves.

``LoadedScheduler`` stands in for the parts of ``core.scheduler.Scheduler`` the job manager uses;
it lets a test say "a voice request is streaming now" or "hold this job's stream half-way" without
timing. Its snapshots and finished requests are the engine's real types.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from freezegun.api import FrozenDateTimeFactory
from homeassistant.core import HomeAssistant
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import async_fire_time_changed

from custom_components.llm_lanes.core.errors import SchedulerClosedError
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk, TokenUsage
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.snapshot import (
    FinishedRequest,
    LaneSnapshot,
    SchedulerSnapshot,
)
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens
from custom_components.llm_lanes.jobs.throttles import JobSettings

ENTRY_ID = "01JOBSTESTENTRY00000000000"
ANSWER = ("The ", "house ", "was ", "quiet.")


@dataclass(slots=True)
class StreamCall:
    """One request a job sent."""

    request: ChatRequest
    lane: Lane
    requester: str
    closed: bool = False
    completed: bool = False


@dataclass
class LoadedScheduler:
    """A scheduler stand-in whose voice load, failures and stream pace the test sets."""

    settings: SchedulerSettings = field(default_factory=SchedulerSettings)
    voice_in_flight: int = 0
    interactive_queued: int = 0
    voice_goodput: float | None = None
    failures: list[Exception] = field(default_factory=list)
    """Raised by the next streams, one each, before any chunk."""
    hold: asyncio.Event | None = None
    """When set, every stream stops after its first chunk until the event is set."""
    calls: list[StreamCall] = field(default_factory=list)
    listeners: list[Callable[[FinishedRequest], None]] = field(default_factory=list)
    closed: bool = False

    def snapshot(self) -> SchedulerSnapshot:
        """Return the load the test set, as real snapshot objects."""
        lanes = {
            lane: _lane_snapshot(
                lane,
                queue_depth=self.interactive_queued if lane is Lane.INTERACTIVE else 0,
                in_flight=(
                    self.voice_in_flight
                    if lane is Lane.VOICE
                    else sum(
                        not c.closed and not c.completed
                        for c in self.calls
                        if c.lane is lane
                    )
                ),
                goodput=self.voice_goodput if lane is Lane.VOICE else None,
            )
            for lane in LANES
        }
        return quiet(
            SchedulerSnapshot,
            settings=self.settings,
            lanes=lanes,
            requesters={},
            queue_depth=sum(s.queue_depth for s in lanes.values()),
            in_flight=sum(s.in_flight for s in lanes.values()),
            window_s=60.0,
        )

    async def stream(
        self,
        chat_request: ChatRequest,
        *,
        lane: Lane,
        requester: str,
        prompt_tokens: int | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """Stream a fixed answer; usage counts come from the engine's estimate."""
        if self.closed:
            raise SchedulerClosedError
        call = StreamCall(chat_request, lane, requester)
        self.calls.append(call)
        try:
            if self.failures:
                raise self.failures.pop(0)
            yield StreamChunk(text=ANSWER[0], output_tokens=1)
            if self.hold is not None:
                await self.hold.wait()
            for piece in ANSWER[1:]:
                yield StreamChunk(text=piece, output_tokens=1)
            call.completed = True
            yield StreamChunk(
                done=True,
                finish_reason="stop",
                usage=TokenUsage(
                    estimate_prompt_tokens(chat_request), len(ANSWER), "server"
                ),
            )
        finally:
            if not call.completed:
                call.closed = True

    def add_listener(
        self, callback: Callable[[FinishedRequest], None]
    ) -> Callable[[], None]:
        """Register a finished-request listener."""
        self.listeners.append(callback)
        return lambda: self.listeners.remove(callback)

    def voice_finished(self) -> None:
        """Say that the voice request finished (as the scheduler would tell listeners)."""
        self.voice_in_flight = 0
        finished = quiet(
            FinishedRequest,
            request_id="voice-1",
            lane=Lane.VOICE,
            requester="satellite.kitchen",
            outcome="ok",
            token_source="server",
        )
        for listener in list(self.listeners):
            listener(finished)


def _lane_snapshot(
    lane: Lane, *, queue_depth: int, in_flight: int, goodput: float | None
) -> LaneSnapshot:
    """Describe a lane with the given load and no latency sample in the window."""
    return quiet(
        LaneSnapshot,
        lane=lane,
        queue_depth=queue_depth,
        in_flight=in_flight,
        goodput=goodput,
    )


QUIET_VALUES: dict[str, Any] = {
    "bool": False,
    "int": 0,
    "float": 0.0,
    "float | None": None,
    "str | None": None,
}
"""What a field of each type holds when nothing happened: zero counts, no figures, no error."""


def quiet[T](cls: type[T], **values: Any) -> T:
    """Build one of the engine's snapshot types from ``values``; its other fields are quiet."""
    required = {
        item.name: QUIET_VALUES[str(item.type)]
        for item in fields(cls)
        if item.default is MISSING and item.name not in values
    }
    return cls(**required, **values)


def local_time(day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    """Return a local wall-clock time in November 2026 (Home Assistant's configured time zone)."""
    return datetime(
        2026, 11, day, hour, minute, second, tzinfo=dt_util.get_default_time_zone()
    )


async def move_to(
    hass: HomeAssistant, freezer: FrozenDateTimeFactory, when: datetime
) -> None:
    """Move the clock and fire the timers that were due, then let the jobs run."""
    freezer.move_to(when)
    async_fire_time_changed(hass, when)
    await hass.async_block_till_done(wait_background_tasks=True)


def settings(**changes: Any) -> JobSettings:
    """Job settings for tests: the default window (01:00-06:00) unless changed."""
    return replace(JobSettings(), **changes)
