"""Where jobs live between restarts: one versioned ``Store`` document per config entry.

The document holds the jobs as plain dictionaries (``Job.as_stored`` / ``Job.from_stored``), the
night's ledger and whether jobs are paused. Migrations bring older documents up to date:

- 1.1: jobs had ``state`` (no ``attempts``, ``last_error`` or ``interrupted``); no ledger, no pause.
- 1.2: jobs have ``status``, ``attempts``, ``last_error`` and ``interrupted``; the document has
  ``ledger`` (``night``, ``tokens``, ``jobs_done``) and ``paused``.
- 1.3: jobs have ``user_id`` (the user who asked; None before, so only admins see those jobs).
  ``attempts`` no longer counts starts an unload or a restart interrupted.
"""

from __future__ import annotations

from typing import Any, TypedDict

from homeassistant.core import HomeAssistant
from homeassistant.helpers.storage import Store

from custom_components.llm_lanes.const import DOMAIN

STORAGE_VERSION = 1
STORAGE_MINOR_VERSION = 3
SAVE_DELAY_S = 1.0
"""Routine changes are written this long after the last one; a new job, a finished job and
the manager's start and stop are written at once."""


class LedgerData(TypedDict):
    """Tokens and jobs of the current night (the run window that opened last)."""

    night: str | None
    """ISO start of that window, in local time."""
    tokens: int
    jobs_done: int


class JobStoreData(TypedDict):
    """The whole stored document."""

    jobs: list[dict[str, Any]]
    ledger: LedgerData
    paused: bool


def storage_key(entry_id: str) -> str:
    """One document per config entry (one LLM server)."""
    return f"{DOMAIN}.jobs.{entry_id}"


class JobStore(Store[JobStoreData]):
    """The jobs of one config entry, migrated to the current layout on load."""

    def __init__(self, hass: HomeAssistant, entry_id: str) -> None:
        """Bind the store to the entry's storage key."""
        super().__init__(
            hass,
            STORAGE_VERSION,
            storage_key(entry_id),
            minor_version=STORAGE_MINOR_VERSION,
            private=True,
            atomic_writes=True,
        )

    async def _async_migrate_func(
        self,
        old_major_version: int,
        old_minor_version: int,
        old_data: dict[str, Any],
    ) -> JobStoreData:
        """Bring a document written by an older version up to the current layout."""
        if old_major_version > STORAGE_VERSION:
            raise NotImplementedError(
                f"job store version {old_major_version} is newer than this integration"
            )
        return migrate_store_data(old_minor_version, old_data)


def migrate_store_data(
    old_minor_version: int, old_data: dict[str, Any]
) -> JobStoreData:
    """Migrate a version-1 document of any minor version to the current one."""
    data: dict[str, Any] = dict(old_data)
    if old_minor_version < 2:
        jobs: list[dict[str, Any]] = []
        for old_job in data.get("jobs", []):
            job = dict(old_job)
            job["status"] = job.pop("state", job.get("status", "queued"))
            job.setdefault("attempts", 0)
            job.setdefault("last_error", None)
            job.setdefault("interrupted", False)
            jobs.append(job)
        data["jobs"] = jobs
        data.setdefault("ledger", {"night": None, "tokens": 0, "jobs_done": 0})
        data.setdefault("paused", False)
    if old_minor_version < 3:
        data["jobs"] = [
            {**job, "user_id": job.get("user_id")} for job in data.get("jobs", [])
        ]
    return {
        "jobs": list(data.get("jobs", [])),
        "ledger": data["ledger"],
        "paused": bool(data.get("paused", False)),
    }
