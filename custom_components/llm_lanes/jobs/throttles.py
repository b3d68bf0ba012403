"""What holds a job back: the run window, the night's budget, the token bucket, a busy house.

``JobSettings`` are the throttles the options flow sets; ``NightLedger`` counts what jobs used since
the window last opened (it is stored); ``TokenBucket`` paces jobs by the tokens they used;
``house_busy`` tells whether voice or interactive requests need the server now; and
``own_wait_reason`` says what holds one job back whatever the others do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Final

from custom_components.llm_lanes.const import DEFAULT_NIGHTLY_END, DEFAULT_NIGHTLY_START
from custom_components.llm_lanes.core.lanes import LANES
from custom_components.llm_lanes.core.snapshot import SchedulerSnapshot
from custom_components.llm_lanes.jobs.model import Job, WaitReason
from custom_components.llm_lanes.jobs.store import LedgerData

QUIET_LANES: Final = tuple(lane for lane in LANES if lane.foreground)
"""Lanes whose requests keep new jobs from starting: those people wait on."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSettings:
    """The throttles of the job system (options flow)."""

    window_start: time = time.fromisoformat(DEFAULT_NIGHTLY_START)
    window_end: time = time.fromisoformat(DEFAULT_NIGHTLY_END)
    """Equal start and end mean the window never closes."""
    max_in_flight: int = 1
    tokens_per_minute: int = 0
    nightly_token_budget: int = 0
    retention_days: int = 7
    max_attempts: int = 3
    retry_base_s: float = 60.0
    """The first retry waits this long; each further one twice as long (at most an hour)."""
    goodput_objective: float = 0.9
    """Jobs hold back while voice or interactive goodput over the window is below this."""

    def in_window(self, local: datetime) -> bool:
        """Whether the run window is open at this local time."""
        start, end, now = self.window_start, self.window_end, local.time()
        if start == end:
            return True
        if start < end:
            return start <= now < end
        return now >= start or now < end

    def night_start(self, local: datetime) -> datetime:
        """When the window that opened last (at or before ``local``) opened: the current night."""
        opened = local.replace(
            hour=self.window_start.hour,
            minute=self.window_start.minute,
            second=self.window_start.second,
            microsecond=0,
        )
        return opened if opened <= local else opened - timedelta(days=1)

    def retry_delay(self, attempts: int) -> timedelta:
        """How long a job waits before attempt number ``attempts + 1``."""
        return timedelta(
            seconds=min(3600.0, self.retry_base_s * 2 ** max(0, attempts - 1))
        )

    def budget_spent(self, tokens_tonight: int) -> bool:
        """Whether the night's token budget is used up (never, without a budget)."""
        budget = self.nightly_token_budget
        return budget > 0 and tokens_tonight >= budget


@dataclass(slots=True)
class NightLedger:
    """What jobs used in the current night: the run window that opened last (kept in the store)."""

    night: str | None = None
    """ISO start of that window, in local time."""
    tokens: int = 0
    jobs_done: int = 0

    @classmethod
    def from_stored(cls, data: LedgerData) -> NightLedger:
        """Rebuild the ledger from the store."""
        return cls(data["night"], data["tokens"], data["jobs_done"])

    def roll(self, night: str) -> bool:
        """Start counting ``night`` afresh unless it is the ledger's night; say whether it did."""
        if self.night == night:
            return False
        self.night, self.tokens, self.jobs_done = night, 0, 0
        return True

    def as_stored(self) -> LedgerData:
        """Return the ledger as the store keeps it."""
        return {"night": self.night, "tokens": self.tokens, "jobs_done": self.jobs_done}


class TokenBucket:
    """Tokens per minute, charged after the fact: a job starts only while the bucket is not in debt.

    The cost of a job is known only once it finished, so its tokens are taken then, possibly
    driving the level below zero; the next job waits until the refill pays the debt back.
    """

    def __init__(self, tokens_per_minute: int, now: float) -> None:
        """Start full."""
        self._rate = tokens_per_minute
        self._level = float(tokens_per_minute)
        self._at = now

    def set_rate(self, tokens_per_minute: int, now: float) -> None:
        """Change the rate (0 disables the limit)."""
        self._refill(now)
        self._rate = tokens_per_minute
        self._level = min(self._level, float(tokens_per_minute))

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._level = min(
                float(self._rate), self._level + (now - self._at) * self._rate / 60.0
            )
        self._at = now

    def allows_start(self, now: float) -> bool:
        """Whether a job may start now."""
        if self._rate <= 0:
            return True
        self._refill(now)
        return self._level > 0

    def spend(self, tokens: int, now: float) -> None:
        """Charge the tokens a job used."""
        self._refill(now)
        self._level -= tokens


def house_busy(snapshot: SchedulerSnapshot, goodput_objective: float) -> bool:
    """Whether voice or interactive requests are queued or streaming, or miss their objectives."""
    for lane in QUIET_LANES:
        state = snapshot.lanes.get(lane)
        if state is None:
            continue
        if state.queue_depth > 0 or state.in_flight > 0:
            return True
        if state.goodput is not None and state.goodput < goodput_objective:
            return True
    return False


def own_wait_reason(
    job: Job, now: datetime, *, window_open: bool, budget_spent: bool
) -> WaitReason | None:
    """Why this job may not start, whatever the others do: its back-off, the window, the budget.

    A job asked to run now waits only for its back-off (and for what holds every job back).
    """
    if job.not_before is not None and job.not_before > now:
        return WaitReason.RETRY_BACKOFF
    if job.run_now:
        return None
    if not window_open:
        return WaitReason.OUTSIDE_WINDOW
    if budget_spent:
        return WaitReason.BUDGET_SPENT
    return None
