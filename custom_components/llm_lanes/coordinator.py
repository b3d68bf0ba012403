"""Polls one LLM server's health, identity and live load."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from homeassistant.core import HomeAssistant
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed
from homeassistant.util import dt as dt_util

from .const import CONF_MODEL, DOMAIN, LOGGER, SERVER_POLL_INTERVAL
from .core.backends.base import Backend, ServerInfo, ServerMetrics
from .core.errors import BackendError

if TYPE_CHECKING:
    from .models import LLMLanesConfigEntry


@dataclass(frozen=True, slots=True)
class ServerState:
    """What the server said at the last successful poll."""

    info: ServerInfo
    metrics: ServerMetrics
    model_loaded: bool
    """Whether the configured model is resident (or, where the server does not say, served)."""


def model_is_loaded(model: str, info: ServerInfo, metrics: ServerMetrics) -> bool:
    """Tell whether ``model`` is loaded, from whatever the server reports."""
    loaded = set(info.loaded_models) | set(metrics.loaded_models)
    if loaded:
        return model in loaded
    # Servers that serve one model and do not report residency (llama.cpp, vLLM).
    return model in info.models


class ServerCoordinator(DataUpdateCoordinator[ServerState]):
    """Polls ``server_info`` and ``metrics``; entities go unavailable when a poll fails."""

    config_entry: LLMLanesConfigEntry

    def __init__(
        self, hass: HomeAssistant, entry: LLMLanesConfigEntry, backend: Backend
    ) -> None:
        """Poll ``backend`` for ``entry`` every ``SERVER_POLL_INTERVAL``."""
        super().__init__(
            hass,
            LOGGER,
            config_entry=entry,
            name=f"{DOMAIN} server {entry.title}",
            update_interval=SERVER_POLL_INTERVAL,
        )
        self.backend = backend
        self.model: str = entry.data[CONF_MODEL]
        self.unreachable_since: datetime | None = None
        """When polls started failing (None while the server answers)."""

    async def _async_update_data(self) -> ServerState:
        """Ask the server what it is and how loaded it is."""
        try:
            info = await self.backend.server_info()
        except BackendError as err:
            if self.unreachable_since is None:
                self.unreachable_since = dt_util.utcnow()
            raise UpdateFailed(
                translation_domain=DOMAIN,
                translation_key="update_failed",
                translation_placeholders={"error": str(err)},
            ) from err
        self.unreachable_since = None
        try:
            metrics = await self.backend.metrics()
        except BackendError as err:
            # Metrics are optional (llama.cpp without --metrics): the server is still up.
            LOGGER.debug("Server metrics unavailable: %s", err)
            metrics = ServerMetrics()
        return ServerState(
            info=info,
            metrics=metrics,
            model_loaded=model_is_loaded(self.model, info, metrics),
        )
