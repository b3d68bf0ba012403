"""Constants of the LLM Lanes integration."""

from __future__ import annotations

from datetime import timedelta
import logging
from typing import Final

DOMAIN: Final = "llm_lanes"
LOGGER = logging.getLogger(__package__)

CONF_MODEL: Final = "model"
CONF_KIND: Final = "kind"
"""The detected server kind (a ``ServerKind`` value), stored so set-up needs no new detection."""

# Option keys shared by the options flow and the control entities (number/switch/select). Changing
# one of them through ``hass.config_entries.async_update_entry(entry, options=...)`` re-applies the
# scheduler settings live, without reloading the entry.
OPT_POLICY: Final = "policy"
OPT_MAX_SEQUENCES: Final = "max_sequences"
OPT_BACKGROUND_SHARE: Final = "background_share"
OPT_BACKGROUND_PAUSED: Final = "background_paused"

# Further scheduler options (options flow only).
OPT_PREFILL_BUDGET: Final = "prefill_budget"
OPT_HEADROOM: Final = "headroom"
OPT_AGING_S: Final = "aging_s"
OPT_PREEMPTION: Final = "preemption"
OPT_PREFILL_GUARD: Final = "prefill_guard_tokens"
OPT_BACKGROUND_WITH_VOICE: Final = "background_with_voice"
OPT_QUOTA_TOKENS_PER_DAY: Final = "quota_tokens_per_day"
OPT_REQUESTER_QUOTAS: Final = "requester_quotas"
"""One ``requester=tokens`` pair per line."""
OPT_QUOTA_ACTION: Final = "quota_action"
OPT_NIGHTLY_START: Final = "nightly_start"
"""Start of the window in which background jobs run (``HH:MM:SS``)."""
OPT_NIGHTLY_END: Final = "nightly_end"
OPT_JOBS_MAX_IN_FLIGHT: Final = "jobs_max_in_flight"
OPT_JOBS_TOKENS_PER_MINUTE: Final = "jobs_tokens_per_minute"
"""0 means no rate limit."""
OPT_JOBS_NIGHTLY_BUDGET: Final = "jobs_nightly_token_budget"
"""0 means no budget."""
OPT_JOBS_RETENTION_DAYS: Final = "jobs_retention_days"
SETTING_OPTIONS: Final = (
    OPT_POLICY,
    OPT_PREFILL_BUDGET,
    OPT_HEADROOM,
    OPT_AGING_S,
    OPT_BACKGROUND_SHARE,
    OPT_PREEMPTION,
    OPT_PREFILL_GUARD,
    OPT_BACKGROUND_PAUSED,
    OPT_QUOTA_TOKENS_PER_DAY,
    OPT_QUOTA_ACTION,
)
"""Options named after the scheduler setting they hold, stored as a value of that setting's type.

The other scheduler options need more than a conversion: max sequences defaults to the server's
slots, background-with-voice stores "no cap" as 0, requester quotas are text.
"""
LANE_OPTION_LIMITS: Final = (
    "ttft_slo_s",
    "itl_slo_s",
    "max_output_tokens",
    "max_queued",
)
"""Lane limits the options flow edits; stored under ``options[<lane key>][<limit>]``."""

# The household's pool (options section ``pool``): where this server stands for each lane, and
# the entities that wake it and put it to sleep.
OPT_POOL: Final = "pool"
POOL_RANK: Final = "{lane}_rank"
"""The key of a lane's rank in the pool section: 1 first choice, 2 second...; 0 never."""
POOL_RANKS: Final = (1, 2, 3, 4)
OPT_WAKE_ENTITY: Final = "wake_entity"
"""A ``button`` (pressed) or ``switch`` (turned on) that starts the server's machine."""
OPT_SLEEP_ENTITY: Final = "sleep_entity"
"""A ``button`` (pressed) or ``switch`` (turned off) that puts the machine to sleep."""
OPT_IDLE_SLEEP_MINUTES: Final = "idle_sleep_minutes"
"""Idle minutes after its work before the machine is put to sleep (0: never)."""
OPT_WAKE_LIMIT_S: Final = "wake_limit_s"
"""How long a woken server is given to answer."""
POWER_DOMAINS: Final = ("button", "switch")

DEFAULT_NIGHTLY_START: Final = "01:00:00"
DEFAULT_NIGHTLY_END: Final = "06:00:00"

# Subentries (as core's Ollama integration names them).
SUBENTRY_CONVERSATION: Final = "conversation"
SUBENTRY_AI_TASK: Final = "ai_task_data"
CONF_PROMPT: Final = "prompt"
CONF_LLM_HASS_API: Final = "llm_hass_api"
CONF_TEMPERATURE: Final = "temperature"
DEFAULT_TEMPERATURE: Final = 0.7

CONF_POOL: Final = "pool"
"""On an agent, an AI Task entity or a client: send its requests to the household's pool (every
loaded server, routed per request) instead of this server alone."""

# Client subentries: apps outside Home Assistant that reach the server through the gateway.
SUBENTRY_CLIENT: Final = "client"
CONF_LANE: Final = "lane"
CONF_QUOTA_TOKENS_PER_DAY: Final = "quota_tokens_per_day"
"""A client's rolling 24 h token budget (absent or 0: the server's default quota)."""
CONF_MAX_OUTPUT_TOKENS: Final = "max_output_tokens"
"""The most output tokens one request of the client may produce (absent: the lane's limit)."""
CONF_ROTATE_KEY: Final = "rotate_key"
DEFAULT_CLIENT_NAME: Final = "LLM client"

SERVER_POLL_INTERVAL: Final = timedelta(seconds=30)
UNREACHABLE_REPAIR_AFTER: Final = timedelta(minutes=5)
"""How long the server may be down before a repair issue is raised."""
SETUP_TIMEOUT_S: Final = 10.0

EVENT_REQUEST_FINISHED: Final = "llm_lanes_request_finished"
EVENT_SUMMARY_READY: Final = "llm_lanes_summary_ready"
UNIT_TOKENS: Final = "tokens"
"""The unit of the token sensors (Home Assistant has none)."""
