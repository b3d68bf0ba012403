"""What a loaded config entry holds at run time (``entry.runtime_data``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from homeassistant.config_entries import ConfigEntry

from .core.backends.base import Backend

if TYPE_CHECKING:
    from .activity import ActivityCoordinator
    from .coordinator import ServerCoordinator
    from .core.scheduler import Scheduler


@dataclass(slots=True)
class LLMLanesRuntimeData:
    """Everything one LLM server entry owns while it is loaded."""

    backend: Backend
    scheduler: Scheduler
    server: ServerCoordinator
    """Polls the server's health, info and metrics (DataUpdateCoordinator[ServerState])."""
    activity: ActivityCoordinator
    """Scheduler snapshots pushed by the scheduler, at most once a second
    (DataUpdateCoordinator[SchedulerSnapshot])."""


type LLMLanesConfigEntry = ConfigEntry[LLMLanesRuntimeData]
