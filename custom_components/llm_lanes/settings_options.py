"""The one place where a config entry's options become settings: the scheduler's, the jobs', the pool's.

What the server says bounds them too: its slot count is the default max sequences, and its context
per slot caps every lane's prompt and output limits (a longer request could never run there) and
sizes each lane's default answer to at most a quarter of the slot (``core.slot_context``), so a
prompt has room beside it on a small slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import time
from typing import Any

from custom_components.llm_lanes.const import (
    LANE_OPTION_LIMITS,
    OPT_BACKGROUND_WITH_VOICE,
    OPT_IDLE_SLEEP_MINUTES,
    OPT_JOBS_MAX_IN_FLIGHT,
    OPT_JOBS_NIGHTLY_BUDGET,
    OPT_JOBS_RETENTION_DAYS,
    OPT_JOBS_TOKENS_PER_MINUTE,
    OPT_MAX_SEQUENCES,
    OPT_NIGHTLY_END,
    OPT_NIGHTLY_START,
    OPT_POOL,
    OPT_REQUESTER_QUOTAS,
    OPT_SLEEP_ENTITY,
    OPT_WAKE_ENTITY,
    OPT_WAKE_LIMIT_S,
    POOL_RANK,
    SETTING_OPTIONS,
)
from custom_components.llm_lanes.core.availability import DEFAULT_WAKE_LIMIT_S
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.slot_context import default_answer_tokens
from custom_components.llm_lanes.jobs.throttles import JobSettings

DEFAULT_SLOTS = 4
"""Max sequences when neither the options nor the server say (Ollama's default parallelism)."""


def percent_of_fraction(fraction: float) -> float:
    """Show a fraction the scheduler uses (the background share) in percent."""
    return round(fraction * 100, 1)


def fraction_of_percent(percent: float) -> float:
    """Store a percent a household types as the fraction the scheduler uses."""
    return round(percent / 100, 4)


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
    options: Mapping[str, Any],
    server_slots: int | None,
    server_context: int | None = None,
) -> SchedulerSettings:
    """Build scheduler settings from an entry's options and what the server reports.

    Options not set keep the engine's defaults, except max sequences, which defaults to the slots
    the server reports. Headroom is kept below max sequences so automations can always run. With
    ``server_context`` (tokens one slot holds), no lane lets a prompt or an answer exceed it, and
    no lane's default answer takes more than a quarter of it.
    """
    base = SchedulerSettings()
    settings = replace(
        base,
        **{
            key: type(getattr(base, key))(options[key])
            for key in SETTING_OPTIONS
            if key in options
        },
    )
    max_sequences = int(options.get(OPT_MAX_SEQUENCES) or server_slots or DEFAULT_SLOTS)
    settings = replace(
        settings,
        max_sequences=max_sequences,
        server_slots=server_slots,
        headroom=max(0, min(settings.headroom, max_sequences - 1)),
        # 0 in the form means no cap.
        background_with_voice=int(options.get(OPT_BACKGROUND_WITH_VOICE) or 0) or None,
        requester_quotas=parse_requester_quotas(options.get(OPT_REQUESTER_QUOTAS, "")),
    )
    for lane in LANES:
        lane_options: Mapping[str, Any] = options.get(lane.key) or {}
        changes: dict[str, Any] = {}
        for limit in LANE_OPTION_LIMITS:
            if limit in lane_options:
                current = getattr(settings.lanes[lane], limit)
                changes[limit] = type(current)(lane_options[limit])
        limits = settings.lanes[lane]
        if server_context is not None and server_context > 0:
            for limit in ("max_prompt_tokens", "max_output_tokens"):
                current = changes.get(limit, getattr(limits, limit))
                changes[limit] = min(current, server_context)
        if changes:
            settings = settings.with_lane(lane, **changes)
        limits = settings.lanes[lane]
        default_output = min(
            default_answer_tokens(limits.default_output_tokens, server_context),
            limits.max_output_tokens,
        )
        if default_output != limits.default_output_tokens:
            settings = settings.with_lane(lane, default_output_tokens=default_output)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolOptions:
    """Where one server stands in the household's pool, as its options say (section ``pool``)."""

    ranks: Mapping[Lane, int] = field(default_factory=lambda: dict.fromkeys(LANES, 1))
    """Per lane, 1 for a first choice, 2 for a second...; 0: it never serves the lane."""
    wake_entity: str | None = None
    sleep_entity: str | None = None
    idle_sleep_s: float | None = None
    """After its work and this many idle seconds it is put to sleep (None: never)."""
    wake_limit_s: float = DEFAULT_WAKE_LIMIT_S


def pool_options(options: Mapping[str, Any]) -> PoolOptions:
    """Read the pool section of an entry's options (every lane first choice where unset)."""
    section: Mapping[str, Any] = options.get(OPT_POOL) or {}
    minutes = float(section.get(OPT_IDLE_SLEEP_MINUTES) or 0)
    return PoolOptions(
        ranks={
            lane: max(0, int(section.get(POOL_RANK.format(lane=lane.key), 1)))
            for lane in LANES
        },
        wake_entity=section.get(OPT_WAKE_ENTITY) or None,
        sleep_entity=section.get(OPT_SLEEP_ENTITY) or None,
        idle_sleep_s=minutes * 60 if minutes > 0 else None,
        wake_limit_s=float(section.get(OPT_WAKE_LIMIT_S) or DEFAULT_WAKE_LIMIT_S),
    )


def pool_routes(
    members: Sequence[tuple[str, PoolOptions]],
) -> dict[Lane, tuple[str, ...]]:
    """Return, per lane, the servers that serve it, by rank (equal ranks in the members' order).

    A lane no server serves has an empty route: the pool refuses its requests.
    """
    return {
        lane: tuple(
            name
            for _, _, name in sorted(
                (options.ranks[lane], index, name)
                for index, (name, options) in enumerate(members)
                if options.ranks[lane] > 0
            )
        )
        for lane in LANES
    }


def _parse_time(value: str | time) -> time:
    return value if isinstance(value, time) else time.fromisoformat(value)
