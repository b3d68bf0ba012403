"""Where jobs live between restarts: one ``Store`` document per config entry.

The document holds the jobs as plain dictionaries (``Job.as_stored`` / ``Job.from_stored``), the
night's ledger and whether jobs are paused. Its layout has one version, ``STORAGE_VERSION`` (1),
and nothing to migrate: a later change of the layout raises it and brings the migration
(``Store._async_migrate_func``).
"""

from __future__ import annotations

from typing import Any, TypedDict

from homeassistant.core import HomeAssistant
from homeassistant.helpers.storage import Store

from custom_components.llm_lanes.const import DOMAIN

STORAGE_VERSION = 1
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
    """The jobs of one config entry."""

    def __init__(self, hass: HomeAssistant, entry_id: str) -> None:
        """Bind the store to the entry's storage key."""
        super().__init__(
            hass,
            STORAGE_VERSION,
            storage_key(entry_id),
            private=True,
            atomic_writes=True,
        )
