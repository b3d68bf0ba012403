"""Form schemas of the options flow, and the selectors the subentry flows' forms share with it.

The options form shows some settings as a household thinks of them and stores them as the
scheduler uses them: the background share in percent (stored as a fraction, as the number entity
does), the requester quotas as rows of a known requester (by name) and a token amount (stored as
``requester=tokens`` lines). Its *Several servers* section says where the server stands in the
household's pool: per lane its rank (first choice, second..., never), the entities that wake it
and put it to sleep, its idle minutes before sleep and how long a wake may take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import PERCENTAGE
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import section
from homeassistant.helpers.selector import (
    BooleanSelector,
    EntitySelector,
    EntitySelectorConfig,
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
    ObjectSelector,
    ObjectSelectorConfig,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TimeSelector,
)
import probatio

from custom_components.llm_lanes.const import (
    DEFAULT_NIGHTLY_END,
    DEFAULT_NIGHTLY_START,
    LANE_OPTION_LIMITS,
    OPT_AGING_S,
    OPT_BACKGROUND_PAUSED,
    OPT_BACKGROUND_SHARE,
    OPT_BACKGROUND_WITH_VOICE,
    OPT_HEADROOM,
    OPT_IDLE_SLEEP_MINUTES,
    OPT_JOBS_MAX_IN_FLIGHT,
    OPT_JOBS_NIGHTLY_BUDGET,
    OPT_JOBS_RETENTION_DAYS,
    OPT_JOBS_TOKENS_PER_MINUTE,
    OPT_MAX_SEQUENCES,
    OPT_NIGHTLY_END,
    OPT_NIGHTLY_START,
    OPT_POLICY,
    OPT_POOL,
    OPT_PREEMPTION,
    OPT_PREFILL_BUDGET,
    OPT_PREFILL_GUARD,
    OPT_QUOTA_ACTION,
    OPT_QUOTA_TOKENS_PER_DAY,
    OPT_REQUESTER_QUOTAS,
    OPT_SLEEP_ENTITY,
    OPT_WAKE_ENTITY,
    OPT_WAKE_LIMIT_S,
    POOL_RANK,
    POOL_RANKS,
    POWER_DOMAINS,
)
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.lanes import LANES
from custom_components.llm_lanes.core.settings import Policy, QuotaAction
from custom_components.llm_lanes.requesters import (
    async_requester_name,
    is_requester_id,
    requesters_with_sensors,
    user_requester,
)
from custom_components.llm_lanes.settings_options import (
    fraction_of_percent,
    job_settings_from_options,
    parse_requester_quotas,
    percent_of_fraction,
    pool_options,
    settings_from_options,
)

QUOTA_REQUESTER = "requester"
QUOTA_TOKENS = "tokens"
"""The fields of one row of the requester quotas."""


def number_selector(
    minimum: float, maximum: float, step: float, unit: str | None = None
) -> NumberSelector:
    """Return a number typed in a box, from ``minimum`` to ``maximum`` by ``step``."""
    config = NumberSelectorConfig(
        min=minimum, max=maximum, step=step, mode=NumberSelectorMode.BOX
    )
    if unit is not None:
        config["unit_of_measurement"] = unit
    return NumberSelector(config)


def choice_selector(values: list[str], translation_key: str) -> SelectSelector:
    """Return a drop-down of ``values``, named by the translations of ``translation_key``."""
    return SelectSelector(
        SelectSelectorConfig(
            options=values,
            mode=SelectSelectorMode.DROPDOWN,
            translation_key=translation_key,
        )
    )


TOKEN_AMOUNT = number_selector(0, 1_000_000_000, 1000)
"""A daily quota or a night's budget, in tokens (0: none)."""
PROMPT_TOKENS = number_selector(64, 1_048_576, 64)
"""Tokens of prompts in prefill (the prefill budget)."""

LANE_LIMIT_SELECTORS: dict[str, NumberSelector] = {
    "ttft_slo_s": number_selector(0.05, 600, 0.05, "s"),
    "itl_slo_s": number_selector(0.01, 10, 0.01, "s"),
    "max_output_tokens": number_selector(1, 131072, 1),
    "max_queued": number_selector(1, 10000, 1),
}


async def async_quota_requesters(
    hass: HomeAssistant, entry: LLMLanesConfigEntry
) -> list[SelectOptionDict]:
    """Offer the requesters a quota may name, by the names the household knows them by.

    The people of Home Assistant, every requester the server has charged (a token sensor, or the
    running scheduler's statistics) and those the options already give a quota.
    """
    known = set(requesters_with_sensors(hass, entry.entry_id))
    known.update(parse_requester_quotas(entry.options.get(OPT_REQUESTER_QUOTAS, "")))
    known.update(
        user_requester(user.id)
        for user in await hass.auth.async_get_users()
        if user.is_active and not user.system_generated
    )
    if entry.state is ConfigEntryState.LOADED:
        known.update(entry.runtime_data.scheduler.snapshot().requesters)
    offered: list[SelectOptionDict] = []
    for requester in known:
        name = await async_requester_name(hass, requester)
        kind, sep, _ = requester.partition(":")
        label = f"{name} ({kind})" if sep and name != requester else name
        offered.append(SelectOptionDict(value=requester, label=label))
    return sorted(offered, key=lambda option: option["label"].casefold())


def quota_rows(text: str) -> list[dict[str, Any]]:
    """Show stored ``requester=tokens`` lines as rows of the quota picker."""
    return [
        {QUOTA_REQUESTER: requester, QUOTA_TOKENS: tokens}
        for requester, tokens in parse_requester_quotas(text).items()
    ]


def quota_text(rows: list[Mapping[str, Any]]) -> str:
    """Store the picker's rows as ``requester=tokens`` lines (a later row for one requester wins).

    Raises ``ValueError`` when a requester is no requester id or an amount is not a whole number
    of tokens from 0 up.
    """
    quotas: dict[str, int] = {}
    for row in rows:
        requester = str(row.get(QUOTA_REQUESTER, "")).strip()
        tokens = float(row.get(QUOTA_TOKENS, -1))
        if not is_requester_id(requester) or tokens < 0 or not tokens.is_integer():
            raise ValueError(f"not a quota: {row!r}")
        quotas[requester] = int(tokens)
    return "\n".join(f"{requester}={tokens}" for requester, tokens in quotas.items())


def _quota_selector(requesters: list[SelectOptionDict]) -> ObjectSelector:
    return ObjectSelector(
        ObjectSelectorConfig(
            multiple=True,
            label_field=QUOTA_REQUESTER,
            description_field=QUOTA_TOKENS,
            translation_key="requester_quota",
            fields={
                QUOTA_REQUESTER: {
                    "selector": SelectSelector(
                        SelectSelectorConfig(
                            options=requesters,
                            mode=SelectSelectorMode.DROPDOWN,
                            custom_value=True,
                        )
                    ),
                    "required": True,
                },
                QUOTA_TOKENS: {
                    "selector": number_selector(0, 1_000_000_000, 1000, "tokens"),
                    "required": True,
                },
            },
        )
    )


NEVER_RANK = "0"
"""The rank of a lane the server never serves in the pool."""
POWER_ENTITY = EntitySelector(EntitySelectorConfig(domain=list(POWER_DOMAINS)))


def options_errors(user_input: Mapping[str, Any]) -> dict[str, str]:
    """Check the submitted options against each other (the selectors check each one alone)."""
    if int(user_input[OPT_HEADROOM]) >= int(user_input[OPT_MAX_SEQUENCES]):
        return {OPT_HEADROOM: "headroom_not_below_max_sequences"}
    pool: Mapping[str, Any] = user_input.get(OPT_POOL) or {}
    if float(pool.get(OPT_IDLE_SLEEP_MINUTES) or 0) > 0 and not pool.get(
        OPT_SLEEP_ENTITY
    ):
        return {"base": "idle_sleep_without_entity"}
    return {}


def _pool_section(
    options: Mapping[str, Any], shown: Mapping[str, Any]
) -> dict[Any, Any]:
    """Build the fields of the *Several servers* section (what was sent, else what is stored)."""
    current = pool_options(options)
    fields: dict[Any, Any] = {}
    for lane in LANES:
        key = POOL_RANK.format(lane=lane.key)
        fields[
            probatio.Required(key, default=str(shown.get(key, current.ranks[lane])))
        ] = choice_selector(
            [*(str(rank) for rank in POOL_RANKS), NEVER_RANK], "pool_rank"
        )
    for key, entity in (
        (OPT_WAKE_ENTITY, current.wake_entity),
        (OPT_SLEEP_ENTITY, current.sleep_entity),
    ):
        fields[
            probatio.Optional(
                key, description={"suggested_value": shown.get(key, entity)}
            )
        ] = POWER_ENTITY
    idle_minutes = (current.idle_sleep_s or 0) / 60
    fields[
        probatio.Required(
            OPT_IDLE_SLEEP_MINUTES,
            default=shown.get(OPT_IDLE_SLEEP_MINUTES, round(idle_minutes)),
        )
    ] = number_selector(0, 1440, 1, "min")
    fields[
        probatio.Required(
            OPT_WAKE_LIMIT_S, default=shown.get(OPT_WAKE_LIMIT_S, current.wake_limit_s)
        )
    ] = number_selector(10, 1800, 1, "s")
    return fields


def pool_to_store(section: Mapping[str, Any]) -> dict[str, Any]:
    """Store the *Several servers* section: ranks as whole numbers (0: never), cleared entities left out."""
    stored: dict[str, Any] = {}
    for lane in LANES:
        key = POOL_RANK.format(lane=lane.key)
        if key in section:
            stored[key] = int(section[key])
    for key in (OPT_WAKE_ENTITY, OPT_SLEEP_ENTITY):
        if section.get(key):
            stored[key] = str(section[key])
    if OPT_IDLE_SLEEP_MINUTES in section:
        stored[OPT_IDLE_SLEEP_MINUTES] = int(section[OPT_IDLE_SLEEP_MINUTES])
    if OPT_WAKE_LIMIT_S in section:
        stored[OPT_WAKE_LIMIT_S] = float(section[OPT_WAKE_LIMIT_S])
    return stored


def options_schema(
    options: Mapping[str, Any],
    server_slots: int | None,
    user_input: Mapping[str, Any] | None = None,
    requesters: list[SelectOptionDict] | None = None,
) -> probatio.Schema:
    """Build the options form, filled with the current values (or what the user just sent).

    ``requesters``: who the quota picker offers (``async_quota_requesters``).
    """
    current = settings_from_options(options, server_slots)
    jobs = job_settings_from_options(options)
    shown: Mapping[str, Any] = user_input or {}

    def required(key: str, value: Any) -> probatio.Required:
        """Ask for ``key``, showing what was sent, else what is stored, else ``value``."""
        return probatio.Required(key, default=shown.get(key, options.get(key, value)))

    fields: dict[Any, Any] = {
        required(OPT_POLICY, current.policy.value): choice_selector(
            [policy.value for policy in Policy], "policy"
        ),
        required(OPT_MAX_SEQUENCES, current.max_sequences): number_selector(1, 256, 1),
        required(OPT_PREFILL_BUDGET, current.prefill_budget): PROMPT_TOKENS,
        required(OPT_HEADROOM, current.headroom): number_selector(0, 255, 1),
        required(OPT_AGING_S, current.aging_s): number_selector(1, 3600, 1, "s"),
        probatio.Required(
            OPT_BACKGROUND_SHARE,
            default=shown.get(
                OPT_BACKGROUND_SHARE, percent_of_fraction(current.background_share)
            ),
        ): number_selector(0, 100, 1, PERCENTAGE),
        required(OPT_PREEMPTION, current.preemption): BooleanSelector(),
        required(OPT_PREFILL_GUARD, current.prefill_guard_tokens): number_selector(
            0, 1_048_576, 64
        ),
        required(
            OPT_BACKGROUND_WITH_VOICE, current.background_with_voice or 0
        ): number_selector(0, 255, 1),
        required(OPT_BACKGROUND_PAUSED, current.background_paused): BooleanSelector(),
        required(OPT_QUOTA_TOKENS_PER_DAY, current.quota_tokens_per_day): TOKEN_AMOUNT,
        probatio.Optional(
            OPT_REQUESTER_QUOTAS,
            description={
                "suggested_value": shown.get(
                    OPT_REQUESTER_QUOTAS,
                    quota_rows(options.get(OPT_REQUESTER_QUOTAS, "")),
                )
            },
        ): _quota_selector(requesters or []),
        required(OPT_QUOTA_ACTION, current.quota_action.value): choice_selector(
            [action.value for action in QuotaAction], "quota_action"
        ),
        required(OPT_NIGHTLY_START, DEFAULT_NIGHTLY_START): TimeSelector(),
        required(OPT_NIGHTLY_END, DEFAULT_NIGHTLY_END): TimeSelector(),
        required(OPT_JOBS_MAX_IN_FLIGHT, jobs.max_in_flight): number_selector(1, 8, 1),
        required(OPT_JOBS_TOKENS_PER_MINUTE, jobs.tokens_per_minute): number_selector(
            0, 1_000_000, 100
        ),
        required(OPT_JOBS_NIGHTLY_BUDGET, jobs.nightly_token_budget): TOKEN_AMOUNT,
        required(OPT_JOBS_RETENTION_DAYS, jobs.retention_days): number_selector(
            1, 365, 1
        ),
    }
    for lane in LANES:
        limits = current.lanes[lane]
        lane_shown: Mapping[str, Any] = shown.get(lane.key) or {}
        lane_fields = {
            probatio.Required(
                limit, default=lane_shown.get(limit, getattr(limits, limit))
            ): LANE_LIMIT_SELECTORS[limit]
            for limit in LANE_OPTION_LIMITS
        }
        fields[probatio.Optional(lane.key)] = section(
            probatio.Schema(lane_fields), {"collapsed": True}
        )
    fields[probatio.Optional(OPT_POOL)] = section(
        probatio.Schema(_pool_section(options, shown.get(OPT_POOL) or {})),
        {"collapsed": True},
    )
    return probatio.Schema(fields)


def options_to_store(
    previous: Mapping[str, Any], user_input: Mapping[str, Any]
) -> dict[str, Any]:
    """Store the submitted options as the scheduler reads them; raise ``ValueError`` if invalid.

    Whole numbers as int, the background share as a fraction, the quotas as text.
    """
    integer_keys = {
        OPT_MAX_SEQUENCES,
        OPT_PREFILL_BUDGET,
        OPT_HEADROOM,
        OPT_PREFILL_GUARD,
        OPT_BACKGROUND_WITH_VOICE,
        OPT_QUOTA_TOKENS_PER_DAY,
        OPT_JOBS_MAX_IN_FLIGHT,
        OPT_JOBS_TOKENS_PER_MINUTE,
        OPT_JOBS_NIGHTLY_BUDGET,
        OPT_JOBS_RETENTION_DAYS,
    }
    options: dict[str, Any] = {**previous}
    for key, value in user_input.items():
        if key in {lane.key for lane in LANES}:
            options[key] = {
                limit: int(raw)
                if limit in {"max_output_tokens", "max_queued"}
                else float(raw)
                for limit, raw in dict(value).items()
            }
        elif key in integer_keys:
            options[key] = int(value)
        elif key == OPT_BACKGROUND_SHARE:
            options[key] = fraction_of_percent(float(value))
        elif key == OPT_REQUESTER_QUOTAS:
            options[key] = quota_text(list(value or []))
        elif key == OPT_POOL:
            options[key] = pool_to_store(dict(value))
        else:
            options[key] = value
    if OPT_REQUESTER_QUOTAS not in user_input:
        # Every row removed: the form leaves the field out.
        options[OPT_REQUESTER_QUOTAS] = ""
    return options
