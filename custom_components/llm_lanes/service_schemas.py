"""The fields of the actions, their limits, and the schemas that check a call before its handler.

Every field is bounded (length, range, characters); values the validators cannot convert (a
look-back of ``1e20`` seconds, a number too large for a float) are refused like any other
malformed value, never with a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from homeassistant.const import ATTR_CONFIG_ENTRY_ID
from homeassistant.helpers import config_validation as cv
import probatio

from custom_components.llm_lanes.core.bench.calibrate import DEFAULT_SCENARIO
from custom_components.llm_lanes.core.bench.workload import builtin_scenarios
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.jobs.model import JobStatus
from custom_components.llm_lanes.requesters import is_requester_id

ATTR_PROMPT = "prompt"
ATTR_INSTRUCTIONS = "instructions"
ATTR_LANE = "lane"
ATTR_REQUESTER = "requester"
ATTR_MAX_TOKENS = "max_tokens"
ATTR_MODEL = "model"
ATTR_SCENARIO = "scenario"
ATTR_DURATION_S = "duration_s"
ATTR_APPLY = "apply"
ATTR_FORCE = "force"
ATTR_NAME = "name"
ATTR_TEXT = "text"
ATTR_ENTITY_IDS = "entity_ids"
ATTR_LOOK_BACK = "look_back"
ATTR_MAX_OUTPUT_TOKENS = "max_output_tokens"
ATTR_RUN_NOW = "run_now"
ATTR_WAIT = "wait"
ATTR_NOTIFY_TARGET = "notify_target"
ATTR_PERSISTENT_NOTIFICATION = "persistent_notification"
ATTR_JOB_ID = "job_id"
ATTR_STATUS = "status"
ATTR_POOL = "pool"
"""Route over the household's servers (the pool) rather than the server named alone."""

BUILTIN_SCENARIOS: Final = tuple(sorted(builtin_scenarios()))
"""The scenarios ``run_benchmark`` offers, read once (at import, outside the event loop)."""
DEFAULT_LOOK_BACK = timedelta(hours=24)

# --- the limits of the fields -------------------------------------------------------------------

MAX_TEXT_CHARS: Final = 1_000_000
"""A prompt, or a text to summarize (a text is then trimmed to the context, with a note)."""
MAX_INSTRUCTIONS_CHARS: Final = 20_000
MAX_NAME_CHARS: Final = 100
MAX_ID_CHARS: Final = 255
"""Ids and names of things Home Assistant or the server knows (entries, jobs, models, targets)."""
MAX_ENTITIES: Final = 50
MAX_LOOK_BACK: Final = timedelta(days=31)
MAX_TOKENS_FIELD: Final = 1_000_000
"""A sanity bound; the lane's and the server's limits are checked against the call."""


def _not_blank(value: str) -> str:
    if not value.strip():
        raise probatio.Invalid("must not be empty")
    return value


def _text(max_chars: int) -> Callable[[Any], str]:
    """Validate a non-blank string of at most ``max_chars`` characters."""
    return probatio.All(cv.string, probatio.Length(min=1, max=max_chars), _not_blank)


def _no_overflow(validator: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Refuse a value too large to convert (``1e20`` seconds) instead of crashing on it."""

    def validate(value: Any) -> Any:
        try:
            return validator(value)
        except OverflowError as err:
            raise probatio.Invalid("the value is too large") from err

    return validate


def _requester_id(value: Any) -> str:
    """Validate a requester id: at most 128 letters, digits and ``_ . : @ -``."""
    text = cv.string(value)
    if not is_requester_id(text):
        raise probatio.Invalid(
            "a requester is 1 to 128 letters, digits and _ . : @ - (no spaces)"
        )
    return text


_ID = probatio.All(cv.string, probatio.Length(min=1, max=MAX_ID_CHARS))
_TOKENS = probatio.All(
    _no_overflow(probatio.Coerce(int)), probatio.Range(min=1, max=MAX_TOKENS_FIELD)
)

GENERATE_SCHEMA = probatio.Schema(
    {
        probatio.Required(ATTR_CONFIG_ENTRY_ID): _ID,
        probatio.Required(ATTR_PROMPT): _text(MAX_TEXT_CHARS),
        probatio.Optional(ATTR_INSTRUCTIONS): _text(MAX_INSTRUCTIONS_CHARS),
        probatio.Optional(ATTR_LANE, default=Lane.AUTOMATION.key): probatio.In(
            [lane.key for lane in LANES]
        ),
        probatio.Optional(ATTR_REQUESTER): _requester_id,
        probatio.Optional(ATTR_MAX_TOKENS): _TOKENS,
        probatio.Optional(ATTR_MODEL): _ID,
        probatio.Optional(ATTR_POOL, default=False): cv.boolean,
    }
)
RUN_BENCHMARK_SCHEMA = probatio.Schema(
    {
        probatio.Required(ATTR_CONFIG_ENTRY_ID): _ID,
        probatio.Optional(ATTR_SCENARIO, default=DEFAULT_SCENARIO): probatio.In(
            BUILTIN_SCENARIOS
        ),
        probatio.Optional(ATTR_DURATION_S, default=30.0): probatio.All(
            _no_overflow(probatio.Coerce(float)), probatio.Range(min=1, max=600)
        ),
        probatio.Optional(ATTR_APPLY, default=False): cv.boolean,
        probatio.Optional(ATTR_FORCE, default=False): cv.boolean,
    }
)
SUMMARIZE_SCHEMA = probatio.Schema(
    {
        probatio.Optional(ATTR_CONFIG_ENTRY_ID): _ID,
        probatio.Optional(ATTR_NAME): _text(MAX_NAME_CHARS),
        probatio.Exclusive(ATTR_TEXT, "source"): _text(MAX_TEXT_CHARS),
        probatio.Exclusive(ATTR_ENTITY_IDS, "source"): probatio.All(
            cv.ensure_list_csv,
            [cv.entity_id],
            probatio.Length(min=1, max=MAX_ENTITIES),
        ),
        probatio.Optional(ATTR_LOOK_BACK, default=DEFAULT_LOOK_BACK): probatio.All(
            _no_overflow(cv.positive_time_period),
            probatio.Range(min=timedelta(minutes=1), max=MAX_LOOK_BACK),
        ),
        probatio.Optional(ATTR_INSTRUCTIONS): _text(MAX_INSTRUCTIONS_CHARS),
        probatio.Optional(ATTR_REQUESTER): _requester_id,
        probatio.Optional(ATTR_MAX_OUTPUT_TOKENS): _TOKENS,
        probatio.Optional(ATTR_RUN_NOW, default=False): cv.boolean,
        probatio.Optional(ATTR_WAIT, default=False): cv.boolean,
        probatio.Optional(ATTR_NOTIFY_TARGET): _ID,
        probatio.Optional(ATTR_PERSISTENT_NOTIFICATION, default=False): cv.boolean,
        probatio.Optional(ATTR_POOL, default=False): cv.boolean,
    }
)
CANCEL_JOB_SCHEMA = probatio.Schema(
    {
        probatio.Optional(ATTR_CONFIG_ENTRY_ID): _ID,
        probatio.Required(ATTR_JOB_ID): _ID,
    }
)
LIST_JOBS_SCHEMA = probatio.Schema(
    {
        probatio.Optional(ATTR_CONFIG_ENTRY_ID): _ID,
        probatio.Optional(ATTR_STATUS): probatio.All(
            cv.ensure_list, [probatio.In([status.value for status in JobStatus])]
        ),
    }
)
