"""The one place where a config entry's options become settings: the scheduler's and the jobs'."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import time
from typing import Any

from .const import (
    LANE_OPTION_LIMITS,
    OPT_AGING_S,
    OPT_BACKGROUND_PAUSED,
    OPT_BACKGROUND_SHARE,
    OPT_BACKGROUND_WITH_VOICE,
    OPT_HEADROOM,
    OPT_JOBS_MAX_IN_FLIGHT,
    OPT_JOBS_NIGHTLY_BUDGET,
    OPT_JOBS_RETENTION_DAYS,
    OPT_JOBS_TOKENS_PER_MINUTE,
    OPT_MAX_SEQUENCES,
    OPT_NIGHTLY_END,
    OPT_NIGHTLY_START,
    OPT_POLICY,
    OPT_PREEMPTION,
    OPT_PREFILL_BUDGET,
    OPT_PREFILL_GUARD,
    OPT_QUOTA_ACTION,
    OPT_QUOTA_TOKENS_PER_DAY,
    OPT_REQUESTER_QUOTAS,
)
from .core.lanes import Lane
from .core.settings import Policy, QuotaAction, SchedulerSettings
from .jobs.throttles import JobSettings

DEFAULT_SLOTS = 4
"""Max sequences when neither the options nor the server say (Ollama's default parallelism)."""


def parse_requester_quotas(text: str) -> dict[str, int]:
    """Parse ``requester=tokens`` pairs, one per line (or separated by commas).

    Raises ``ValueError`` on a malformed pair.
    """
    quotas: dict[str, int] = {}
    for raw in text.replace(",", "\n").splitlines():
        line = raw.strip()
        if not line:
            continue
        requester, sep, tokens = line.rpartition("=")
        requester = requester.strip()
        if not sep or not requester:
            raise ValueError(f"expected requester=tokens, got {line!r}")
        value = int(tokens.strip())
        if value < 0:
            raise ValueError(f"a quota cannot be negative: {line!r}")
        quotas[requester] = value
    return quotas


def settings_from_options(
    options: Mapping[str, Any], server_slots: int | None
) -> SchedulerSettings:
    """Build scheduler settings from an entry's options.

    Options not set keep the engine's defaults, except max sequences, which defaults to the slots
    the server reports. Headroom is kept below max sequences so automations can always run.
    """
    base = SchedulerSettings()
    max_sequences = int(options.get(OPT_MAX_SEQUENCES) or server_slots or DEFAULT_SLOTS)
    headroom = int(options.get(OPT_HEADROOM, base.headroom))
    settings = replace(
        base,
        policy=Policy(options.get(OPT_POLICY, base.policy)),
        max_sequences=max_sequences,
        prefill_budget=int(options.get(OPT_PREFILL_BUDGET, base.prefill_budget)),
        headroom=max(0, min(headroom, max_sequences - 1)),
        aging_s=float(options.get(OPT_AGING_S, base.aging_s)),
        background_share=float(
            options.get(OPT_BACKGROUND_SHARE, base.background_share)
        ),
        preemption=bool(options.get(OPT_PREEMPTION, base.preemption)),
        prefill_guard_tokens=int(
            options.get(OPT_PREFILL_GUARD, base.prefill_guard_tokens)
        ),
        # 0 in the form means no cap.
        background_with_voice=int(options.get(OPT_BACKGROUND_WITH_VOICE) or 0) or None,
        background_paused=bool(
            options.get(OPT_BACKGROUND_PAUSED, base.background_paused)
        ),
        quota_tokens_per_day=int(
            options.get(OPT_QUOTA_TOKENS_PER_DAY, base.quota_tokens_per_day)
        ),
        requester_quotas=parse_requester_quotas(options.get(OPT_REQUESTER_QUOTAS, "")),
        quota_action=QuotaAction(options.get(OPT_QUOTA_ACTION, base.quota_action)),
    )
    for lane in Lane:
        lane_options: Mapping[str, Any] = options.get(lane.key) or {}
        changes: dict[str, Any] = {}
        for limit in LANE_OPTION_LIMITS:
            if limit in lane_options:
                current = getattr(settings.lanes[lane], limit)
                changes[limit] = type(current)(lane_options[limit])
        if changes:
            settings = settings.with_lane(lane, **changes)
        limits = settings.lanes[lane]
        if limits.default_output_tokens > limits.max_output_tokens:
            settings = settings.with_lane(
                lane, default_output_tokens=limits.max_output_tokens
            )
    return settings


def job_settings_from_options(
    options: Mapping[str, Any], current: JobSettings | None = None
) -> JobSettings:
    """Build the job throttles from an entry's options (defaults where unset).

    What no option sets (attempts, back-off, the goodput objective) is kept from ``current``.
    """
    defaults = JobSettings()
    return replace(
        current or defaults,
        window_start=_parse_time(options.get(OPT_NIGHTLY_START, defaults.window_start)),
        window_end=_parse_time(options.get(OPT_NIGHTLY_END, defaults.window_end)),
        max_in_flight=max(
            1, int(options.get(OPT_JOBS_MAX_IN_FLIGHT, defaults.max_in_flight))
        ),
        tokens_per_minute=max(
            0, int(options.get(OPT_JOBS_TOKENS_PER_MINUTE, defaults.tokens_per_minute))
        ),
        nightly_token_budget=max(
            0, int(options.get(OPT_JOBS_NIGHTLY_BUDGET, defaults.nightly_token_budget))
        ),
        retention_days=max(
            1, int(options.get(OPT_JOBS_RETENTION_DAYS, defaults.retention_days))
        ),
    )


def _parse_time(value: str | time) -> time:
    return value if isinstance(value, time) else time.fromisoformat(value)
