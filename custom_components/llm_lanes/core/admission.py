"""Who is refused at the door: a lane's limits, a spent quota, a full queue.

A refused request never reaches the policy or the server. A requester's quota is spent when the
tokens they used in the last 24 hours and those their requests in flight reserved reach it
(``quotas.py``); a request then runs in the last yielding lane (background) instead when the quota
action is ``demote``. A request whose prompt was bounded rather than counted by the server
(``quota_prompts.py``) and that would cross the quota finds it spent too while another of the
requester's requests is in flight: the one request a quota may be passed by is then alone.
"""

from __future__ import annotations

from custom_components.llm_lanes.core.errors import (
    LanesError,
    QueueFullError,
    QuotaExceededError,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.quota_prompts import QuotaPrompt
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.run_state import RunState
from custom_components.llm_lanes.core.settings import QuotaAction, SchedulerSettings


def admission(
    settings: SchedulerSettings,
    state: RunState,
    quotas: QuotaLedger,
    *,
    lane: Lane,
    requester: str,
    prompt_tokens: int,
    output_tokens: int,
    now: float,
    quota_prompt: QuotaPrompt,
) -> tuple[Lane, LanesError | None]:
    """Return the lane a new request runs in and the error that refuses it (None: queue it).

    ``quota_prompt``: what the prompt reserves of the requester's quota.
    """
    breach = settings.lanes[lane].refusal(
        lane, prompt_tokens=prompt_tokens, output_tokens=output_tokens
    )
    if breach is not None:
        return lane, breach
    quota = settings.quota_for(requester)
    used = quotas.committed(requester, now) if quota > 0 else 0
    if quota > 0 and _spent(
        quotas, requester, quota, used, reserving=quota_prompt, output=output_tokens
    ):
        if settings.quota_action is QuotaAction.REJECT:
            return lane, QuotaExceededError(requester=requester, used=used, quota=quota)
        lane = state.yielding_lanes[-1]
    max_queued = settings.lanes[lane].max_queued
    if state.queued(lane) >= max_queued:
        return lane, QueueFullError(lane=lane.key, max_queued=max_queued)
    return lane, None


def _spent(
    quotas: QuotaLedger,
    requester: str,
    quota: int,
    used: int,
    *,
    reserving: QuotaPrompt,
    output: int,
) -> bool:
    """Whether a request finds its requester's quota spent (``used``: used and reserved)."""
    if used >= quota:
        return True
    # A bound may be wrong: the request that crosses the quota on one runs alone.
    return (
        not reserving.counted
        and used + reserving.tokens + output > quota
        and quotas.reserved(requester) > 0
    )
