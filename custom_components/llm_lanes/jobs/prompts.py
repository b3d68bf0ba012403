"""The prompt of a summarization job: given text, or the recorded history of some entities.

Whatever the source, the prompt is cut to fit the context limit of a job (the background lane's,
or what the server's context leaves beside the answer), and the cut is said out loud: a note is
added to the prompt (so the model can say the summary is partial) and kept on the job (so the user
sees it in ``list_jobs`` and in the ``llm_lanes_summary_ready`` event). Instructions so long that
they leave almost no room for the text are refused (``prompt_does_not_fit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from homeassistant.components.recorder import history
from homeassistant.const import ATTR_FRIENDLY_NAME, ATTR_UNIT_OF_MEASUREMENT
from homeassistant.core import HomeAssistant, State
from homeassistant.helpers.recorder import get_instance
import homeassistant.util.dt as dt_util

from custom_components.llm_lanes.core.tokens import (
    CHARS_PER_TOKEN,
    TOKENS_PER_MESSAGE,
    estimate_text_tokens,
)
from custom_components.llm_lanes.error_translation import validation_error

SYSTEM_PROMPT = (
    "You write short, clear summaries for the people of a household. "
    "Use plain language and keep to the facts you are given."
)
DEFAULT_TEXT_INSTRUCTIONS = "Summarize the following text."
DEFAULT_HISTORY_INSTRUCTIONS = (
    "Summarize what happened in this home from the following history of state changes. "
    "Point out anything unusual."
)
NOTE_RESERVE_TOKENS = 64
"""Room kept for the trimming note itself."""
MIN_BODY_TOKENS = 32
"""The least room the text or history must have beside the instructions (a few lines)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPrompt:
    """The two messages a job sends, and what was left out to fit them."""

    system: str
    user: str
    note: str | None
    """Set when the source was trimmed to the context limit."""
    tokens_estimate: int


def _body_budget(instructions: str, max_prompt_tokens: int) -> int:
    """Tokens left for the text or history once the fixed parts are counted.

    Raises a translated validation error when that leaves less than ``MIN_BODY_TOKENS``.
    """
    fixed = (
        estimate_text_tokens(SYSTEM_PROMPT)
        + estimate_text_tokens(instructions)
        + 2 * TOKENS_PER_MESSAGE
        + NOTE_RESERVE_TOKENS
    )
    budget = max_prompt_tokens - fixed
    if budget < MIN_BODY_TOKENS:
        raise validation_error(
            "prompt_does_not_fit",
            instructions=str(estimate_text_tokens(instructions)),
            fixed=str(fixed + MIN_BODY_TOKENS),
            maximum=str(max_prompt_tokens),
        )
    return budget


def _assemble(instructions: str, body: str, note: str | None) -> JobPrompt:
    user = f"{instructions}\n\n{body}"
    if note is not None:
        user = f"{user}\n\n({note})"
    return JobPrompt(
        system=SYSTEM_PROMPT,
        user=user,
        note=note,
        tokens_estimate=estimate_text_tokens(SYSTEM_PROMPT)
        + estimate_text_tokens(user)
        + 2 * TOKENS_PER_MESSAGE,
    )


def text_prompt(
    text: str, instructions: str | None, max_prompt_tokens: int
) -> JobPrompt:
    """Build the prompt that summarizes ``text``; keep its beginning if it is too long."""
    instructions = instructions or DEFAULT_TEXT_INSTRUCTIONS
    budget = _body_budget(instructions, max_prompt_tokens)
    if estimate_text_tokens(text) <= budget:
        return _assemble(instructions, text, None)
    kept = text[: budget * CHARS_PER_TOKEN]
    note = (
        f"Note: the text was trimmed to fit the context limit of {max_prompt_tokens} tokens; "
        f"only its first {len(kept)} of {len(text)} characters are included."
    )
    return _assemble(instructions, kept, note)


def lines_prompt(
    lines: list[str], instructions: str | None, max_prompt_tokens: int
) -> JobPrompt:
    """Build the prompt from history lines (oldest first); drop the oldest ones if too long."""
    instructions = instructions or DEFAULT_HISTORY_INSTRUCTIONS
    budget = _body_budget(instructions, max_prompt_tokens)
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = estimate_text_tokens(line) + 1
        if used + cost > budget:
            break
        kept.append(line)
        used += cost
    kept.reverse()
    note = None
    if len(kept) < len(lines):
        note = (
            f"Note: the history was trimmed to fit the context limit of {max_prompt_tokens} "
            f"tokens; the oldest {len(lines) - len(kept)} of {len(lines)} entries are left out."
        )
    body = (
        "\n".join(kept) if kept else "(no state changes were recorded in this period)"
    )
    return _assemble(instructions, body, note)


def format_state(state: State) -> str:
    """One history line, as the logbook would say it: local time, name, new state."""
    when = dt_util.as_local(state.last_changed).strftime("%Y-%m-%d %H:%M")
    name = state.attributes.get(ATTR_FRIENDLY_NAME) or state.entity_id
    unit = state.attributes.get(ATTR_UNIT_OF_MEASUREMENT)
    value = f"{state.state} {unit}" if unit else state.state
    return f"{when} {name}: {value}"


async def async_history_lines(
    hass: HomeAssistant, entity_ids: list[str], start: datetime, end: datetime
) -> list[str]:
    """Every recorded state change of the entities between ``start`` and ``end``, oldest first.

    The state each entity had at ``start`` is included, so the summary knows where things began.
    """
    found = await get_instance(hass).async_add_executor_job(
        lambda: history.get_significant_states(
            hass,
            start,
            end,
            entity_ids,
            include_start_time_state=True,
            significant_changes_only=False,
        )
    )
    states = [
        state
        for entity_states in found.values()
        for state in entity_states
        if isinstance(state, State)
    ]
    states.sort(key=lambda state: (state.last_changed, state.entity_id))
    return [format_state(state) for state in states]


async def async_history_prompt(
    hass: HomeAssistant,
    entity_ids: list[str],
    look_back: timedelta,
    instructions: str | None,
    max_prompt_tokens: int,
) -> JobPrompt:
    """Build the prompt from the recorder's history of the entities over the look-back period."""
    end = dt_util.utcnow()
    lines = await async_history_lines(hass, entity_ids, end - look_back, end)
    return lines_prompt(lines, instructions, max_prompt_tokens)
