"""Diagnostics of a server entry: settings, server, scheduler, jobs; no secrets, no prompts."""

from __future__ import annotations

from dataclasses import asdict
from enum import Enum
from typing import Any

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.const import CONF_API_KEY
from homeassistant.core import HomeAssistant

from .const import CONF_PROMPT
from .coordinator import LLMLanesConfigEntry

TO_REDACT = {CONF_API_KEY, CONF_PROMPT}


def _plain(value: Any) -> Any:
    """Make dataclass dumps JSON-friendly (enum keys and values as their names)."""
    if isinstance(value, dict):
        return {
            (key.name.lower() if isinstance(key, Enum) else key): _plain(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Enum):
        return value.value
    return value


async def async_get_config_entry_diagnostics(
    hass: HomeAssistant, entry: LLMLanesConfigEntry
) -> dict[str, Any]:
    """Describe the entry (API key and instructions redacted; snapshots hold no prompt text)."""
    runtime = entry.runtime_data
    server = runtime.server
    snapshot = runtime.scheduler.snapshot()
    return {
        "entry": {
            "title": entry.title,
            "data": async_redact_data(dict(entry.data), TO_REDACT),
            "options": async_redact_data(dict(entry.options), TO_REDACT),
            "subentries": [
                {
                    "type": subentry.subentry_type,
                    "title": subentry.title,
                    "data": async_redact_data(dict(subentry.data), TO_REDACT),
                }
                for subentry in entry.subentries.values()
            ],
        },
        "server": {
            "last_update_success": server.last_update_success,
            "unreachable_since": (
                server.unreachable_since.isoformat()
                if server.unreachable_since
                else None
            ),
            "state": _plain(asdict(server.data)) if server.data is not None else None,
        },
        "scheduler": _plain(asdict(snapshot)),
        "jobs": [
            {
                "id": job.id,
                "status": job.status.value,
                "attempts": job.attempts,
                "interrupted": job.interrupted,
                "wait_reason": job.wait_reason.value if job.wait_reason else None,
                "last_error": job.last_error,
                "prompt_tokens": job.prompt_tokens,
                "output_tokens": job.output_tokens,
            }
            for job in runtime.jobs.jobs()
        ],
    }
