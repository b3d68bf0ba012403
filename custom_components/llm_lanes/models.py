"""What a loaded config entry holds at run time (``entry.runtime_data``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from homeassistant.config_entries import ConfigEntry

from .core.backends.base import Backend

if TYPE_CHECKING:
    from .activity import ActivityCoordinator
    from .coordinator import ServerCoordinator
    from .core.scheduler import Scheduler
    from .jobs import JobManager


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
    jobs: JobManager
    """Queues, throttles and runs the entry's nightly summarization jobs."""
    device_id: str = ""
    """Device registry id of the server's device (the agents' devices hang off it)."""
    subentries: dict[str, tuple[str, str, dict[str, Any]]] = field(default_factory=dict)
    """Subentries the entities were built from (id -> type, title, data); a change reloads."""


type LLMLanesConfigEntry = ConfigEntry[LLMLanesRuntimeData]
