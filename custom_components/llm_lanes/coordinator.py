"""Polls one LLM server's health, identity and live load, and keeps its model loaded."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed
from homeassistant.util import dt as dt_util

from .const import CONF_MODEL, DOMAIN, LOGGER, SERVER_POLL_INTERVAL
from .core.backends.base import Backend, ServerInfo, ServerKind, ServerMetrics
from .core.errors import AuthError, BackendError

if TYPE_CHECKING:
    from .models import LLMLanesConfigEntry

RESIDENCY_KINDS: Final = frozenset({ServerKind.OLLAMA, ServerKind.LM_STUDIO})
"""Servers that load models on demand, unload them, and say which ones are resident.

The others (llama.cpp, vLLM, LocalAI) report every model they serve as loaded, so a warm-up could
never change what they report: warming them up would only be retried forever.
"""

WARM_UP_RETRY_INTERVAL: Final = timedelta(minutes=10)
"""After a warm-up that did not load the model, the next one waits this long."""


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
    if loaded or info.kind in RESIDENCY_KINDS:
        # Ollama and LM Studio list what is resident: an empty list means nothing is.
        return model in loaded
    # Servers that serve one model and do not report residency (llama.cpp, vLLM).
    return model in info.models


class ServerCoordinator(DataUpdateCoordinator[ServerState]):
    """Polls ``server_info`` and ``metrics``; entities go unavailable when a poll fails.

    It also keeps the configured model warm: at set-up, and whenever a poll finds it unloaded
    (the server restarted, or Ollama let it go), one warm-up runs in the background, so the first
    voice command of the day does not pay for a cold load.
    """

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
        self.warm_ups = 0
        """Warm-ups started since set-up."""
        self._warm_up_task: asyncio.Task[None] | None = None
        self._warm_up_not_before: datetime | None = None
        self._warm_up_failed_logged = False
        # Ollama keeps a model another client loaded for 5 minutes only: one warm-up at set-up
        # sends our keep_alive, which keeps it resident, even when it is loaded already.
        self._warm_up_at_setup = backend.kind is ServerKind.OLLAMA

    @property
    def warming_up(self) -> bool:
        """Whether a warm-up is running now."""
        return self._warm_up_task is not None and not self._warm_up_task.done()

    async def _async_update_data(self) -> ServerState:
        """Ask the server what it is and how loaded it is."""
        try:
            info = await self.backend.server_info()
            metrics = await self._async_metrics()
        except AuthError as err:
            raise ConfigEntryAuthFailed(
                translation_domain=DOMAIN, translation_key="invalid_auth"
            ) from err
        except BackendError as err:
            if self.unreachable_since is None:
                self.unreachable_since = dt_util.utcnow()
            raise UpdateFailed(
                translation_domain=DOMAIN,
                translation_key="update_failed",
                translation_placeholders={"error": str(err)},
            ) from err
        if self.unreachable_since is not None:
            # Back after an outage (perhaps a restart that unloaded the model): try at once.
            self._warm_up_not_before = None
            self.unreachable_since = None
        state = ServerState(
            info=info,
            metrics=metrics,
            model_loaded=model_is_loaded(self.model, info, metrics),
        )
        self._async_maybe_warm_up(state)
        return state

    async def _async_metrics(self) -> ServerMetrics:
        try:
            return await self.backend.metrics()
        except AuthError:
            raise
        except BackendError as err:
            # Metrics are optional (llama.cpp without --metrics): the server is still up.
            LOGGER.debug("Server metrics unavailable: %s", err)
            return ServerMetrics()

    def _async_maybe_warm_up(self, state: ServerState) -> None:
        """Start one background warm-up when the model should be loaded and is not."""
        if self.warming_up or self.model not in state.info.models:
            return  # A model the server does not have is a repair issue, not a warm-up.
        at_setup = self._warm_up_at_setup
        self._warm_up_at_setup = False
        if not at_setup:
            if state.model_loaded or self.backend.kind not in RESIDENCY_KINDS:
                return
            if (
                self._warm_up_not_before is not None
                and dt_util.utcnow() < self._warm_up_not_before
            ):
                return
        self.warm_ups += 1
        self._warm_up_task = self.config_entry.async_create_background_task(
            self.hass,
            self._async_warm_up(already_loaded=state.model_loaded),
            name=f"{DOMAIN} warm-up {self.model}",
        )

    async def _async_warm_up(self, *, already_loaded: bool) -> None:
        """Load the model, then poll again so ``model_loaded`` and the sensors follow.

        Success is what the next poll reports, not what the warm-up call says: a server that
        takes the load request but still does not list the model is not asked again at once.
        """
        LOGGER.debug("Warming up %s on %s", self.model, self.backend.base_url)
        try:
            await self.backend.warm_up(self.model)
        except BackendError as err:
            self._async_warm_up_failed(str(err))
            await self.async_refresh()
            return
        await self.async_refresh()
        if not self.last_update_success:
            self._async_warm_up_failed("the server stopped answering")
        elif not self.data.model_loaded:
            self._async_warm_up_failed("the server does not report it as loaded")
        else:
            self._warm_up_not_before = None
            self._warm_up_failed_logged = False
            if not already_loaded:
                LOGGER.info("Loaded model %s on %s", self.model, self.backend.base_url)

    def _async_warm_up_failed(self, reason: str) -> None:
        """Wait before the next try; warn once until a warm-up works again."""
        self._warm_up_not_before = dt_util.utcnow() + WARM_UP_RETRY_INTERVAL
        if self._warm_up_failed_logged:
            LOGGER.debug("Warming up %s failed again: %s", self.model, reason)
            return
        self._warm_up_failed_logged = True
        LOGGER.warning(
            "Could not load model %s on %s (%s); trying again in %s",
            self.model,
            self.backend.base_url,
            reason,
            WARM_UP_RETRY_INTERVAL,
        )
