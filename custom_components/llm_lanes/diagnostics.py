"""Diagnostics of a server entry: settings, server, scheduler, jobs, gateway clients.

No secrets (API keys and client keys are redacted), no prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.const import CONF_API_KEY
from homeassistant.core import HomeAssistant

from custom_components.llm_lanes.const import CONF_PROMPT
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.snapshot import SchedulerSnapshot
from custom_components.llm_lanes.gateway.clients import Client, client_subentries

TO_REDACT = {CONF_API_KEY, CONF_PROMPT}


def _plain(value: Any) -> Any:
    """Make a dataclass JSON-friendly: lanes by their key, enums by their value or name."""
    if isinstance(value, Lane):
        return value.key
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {_plain_key(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Enum):
        return value.value
    return value


def _plain_key(key: Any) -> Any:
    if isinstance(key, Lane):
        return key.key
    return key.name.lower() if isinstance(key, Enum) else key


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
            "state": _plain(server.data) if server.data is not None else None,
        },
        "scheduler": _plain(snapshot),
        "clients": _clients(entry, snapshot),
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


def _clients(
    entry: LLMLanesConfigEntry, snapshot: SchedulerSnapshot
) -> list[dict[str, Any]]:
    """Describe the gateway clients: lane, limits and what they used (never their key)."""
    described: list[dict[str, Any]] = []
    for subentry in client_subentries(entry):
        client = Client.of(subentry)
        used = snapshot.requesters.get(client.requester)
        described.append(
            {
                "name": client.name,
                "requester": client.requester,
                "lane": client.lane.key,
                "quota_tokens_per_day": client.quota_tokens_per_day,
                "max_output_tokens": client.max_output_tokens,
                "tokens_last_24h": used.tokens_last_24h if used else 0,
                "prompt_tokens_total": used.prompt_tokens_total if used else 0,
                "output_tokens_total": used.output_tokens_total if used else 0,
                "finished_total": used.finished_total if used else 0,
                "rejected_total": used.rejected_total if used else 0,
            }
        )
    return described
