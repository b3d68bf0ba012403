"""A lane is data: a fifth lane, defined here and never shipped, is scheduled by its traits."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from custom_components.llm_lanes.core.errors import QueueFullError
from custom_components.llm_lanes.core.lanes import (
    DEFAULT_LANE_LIMITS,
    LANES,
    Lane,
    check_lanes,
)
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings

from .fakes import FakeBackend, FakeClock, chat, served_tags, settle
from .test_scheduler import spawn

ALARM = Lane(
    key="alarm",
    rank=-1,
    foreground=True,
    urgent=True,
    defaults=replace(Lane.VOICE.defaults, max_queued=2, ttft_slo_s=0.2),
)
"""A smoke alarm's spoken warning: before voice, urgent like it."""
OVERNIGHT = Lane(
    key="overnight",
    rank=9,
    yields=True,
    defaults=Lane.BACKGROUND.defaults,
)
"""Re-indexing that may wait for everything else, background included."""


def _scheduler(
    *lanes: Lane, **settings: object
) -> tuple[Scheduler, FakeBackend, FakeClock]:
    clock = FakeClock()
    backend = FakeBackend(clock)
    limits = {**DEFAULT_LANE_LIMITS, **{lane: lane.defaults for lane in lanes}}
    values: dict[str, object] = {"max_sequences": 1, "headroom": 0, "lanes": limits}
    values.update(settings)
    scheduler = Scheduler(backend, SchedulerSettings(**values), clock=clock)  # type: ignore[arg-type]
    return scheduler, backend, clock


async def test_a_fifth_lane_runs_in_its_rank() -> None:
    """With one slot busy, every lane's request waits and they run in rank order."""
    scheduler, backend, _ = _scheduler(ALARM, OVERNIGHT, background_share=0)
    gate = asyncio.Event()
    first = spawn(scheduler, chat(gate=gate, tag="first"), Lane.AUTOMATION, "x")
    await settle()
    lanes = (OVERNIGHT, *reversed(LANES), ALARM)
    tasks = [spawn(scheduler, chat(tag=lane.key), lane, lane.key) for lane in lanes]
    await settle()
    snapshot = scheduler.snapshot()
    assert list(snapshot.lanes) == [ALARM, *LANES, OVERNIGHT]
    assert snapshot.lanes[ALARM].queue_depth == 1
    gate.set()
    await asyncio.gather(first, *tasks)
    assert served_tags(backend) == [
        "first",
        *(lane.key for lane in (ALARM, *LANES, OVERNIGHT)),
    ]
    # The priority passed to servers that take one is the lane's rank.
    assert backend.streams[1].request.priority == -1


async def test_a_fifth_lane_has_its_limits_and_its_traits() -> None:
    """Its own queue limit; urgent, it takes a slot from background by preemption."""
    scheduler, backend, _ = _scheduler(ALARM, max_sequences=1)
    gate = asyncio.Event()
    summary = spawn(scheduler, chat(gate=gate, answer_tokens=50), Lane.BACKGROUND, "j")
    await settle()
    assert len(backend.active) == 1
    alarms = [spawn(scheduler, chat(tag="alarm"), ALARM, "smoke") for _ in range(4)]
    await settle()
    with pytest.raises(QueueFullError):
        await alarms[3]  # one runs, two wait: its queue is full
    await asyncio.gather(*alarms[:3])
    assert scheduler.snapshot().preemptions_total == 1
    gate.set()
    await summary
    assert served_tags(backend)[1:4] == ["alarm"] * 3


async def test_a_yielding_fifth_lane_shares_background_s_guarantees() -> None:
    """Two yielding lanes: a demoted request goes to the last one, the pause holds both."""
    scheduler, backend, _ = _scheduler(
        OVERNIGHT, background_paused=True, quota_tokens_per_day=1
    )
    await scheduler.generate(chat(), lane=Lane.INTERACTIVE, requester="u")
    demoted = spawn(scheduler, chat(tag="demoted"), Lane.INTERACTIVE, "u")
    reindex = spawn(scheduler, chat(tag="reindex"), OVERNIGHT, "indexer")
    await settle()
    snapshot = scheduler.snapshot()
    assert snapshot.lanes[OVERNIGHT].queue_depth == 2  # both held by the pause
    scheduler.update_settings(replace(scheduler.settings, background_paused=False))
    await asyncio.gather(demoted, reindex)
    assert (await demoted).finished.lane is OVERNIGHT


def test_lane_sets_the_rules_cannot_run_are_refused() -> None:
    """Urgent lanes first and foreground, yielding lanes last; distinct keys and ranks."""
    assert check_lanes([*LANES, ALARM])[0] is ALARM
    bad = [
        Lane(key="x", rank=5, urgent=True, defaults=ALARM.defaults),
        Lane(key="y", rank=0, foreground=True, urgent=True, defaults=ALARM.defaults),
        Lane(key="late", rank=5, foreground=True, defaults=ALARM.defaults),
        Lane(key="early", rank=-2, yields=True, defaults=ALARM.defaults),
        Lane(key="voice", rank=7, defaults=ALARM.defaults),
    ]
    for lane in bad:
        with pytest.raises(ValueError):
            check_lanes([*LANES, lane])
    with pytest.raises(ValueError):
        check_lanes(LANES[:3])  # nothing to demote to
    scheduler, _, _ = _scheduler()
    with pytest.raises(ValueError, match="cannot change"):
        scheduler.update_settings(
            replace(
                scheduler.settings,
                lanes={**scheduler.settings.lanes, ALARM: ALARM.defaults},
            )
        )
