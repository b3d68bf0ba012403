"""The requests the gateway is answering, so that Home Assistant's stop ends each with an error.

Home Assistant's HTTP server, when it stops, waits up to 10 s for its handlers, then cancels
them: a stream would end cut short, without a word, seconds after the stop. Instead, as Home
Assistant begins to stop (a shutdown job: before the stop event that stops the HTTP server),
every request in flight is ended at once with ``stopping_error()``: a 503 with ``Retry-After``
when its answer has not begun, the stream's last line (an error event, an error line) when it
has. A request that comes later is refused the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final, Protocol

from homeassistant.core import HassJob, HomeAssistant
from homeassistant.util.hass_dict import HassKey

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.gateway.http_errors import (
    UNAVAILABLE,
    UNAVAILABLE_RETRY_AFTER_S,
    GatewayError,
)

STOP_WAIT_S: Final = 2.0
"""How long the stop waits for the ended requests to write their error and finish."""


class Endable(Protocol):
    """A request being answered, which can be ended with an error."""

    def end(self, error: GatewayError) -> None:
        """End the request with ``error``."""


def stopping_error() -> GatewayError:
    """Return the error of a request that Home Assistant's stop ends or refuses."""
    return GatewayError(
        HTTPStatus.SERVICE_UNAVAILABLE,
        "Home Assistant is stopping; try again once it has started",
        kind=UNAVAILABLE,
        code="shutting_down",
        retry_after=UNAVAILABLE_RETRY_AFTER_S,
    )


@dataclass(slots=True)
class InFlight:
    """The gateway's requests in flight, and whether Home Assistant is stopping."""

    requests: set[Endable] = field(default_factory=set)
    stopping: bool = False
    """Whether Home Assistant is stopping: a request that comes now is refused."""
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, request: Endable) -> None:
        """Count a request in (its handler has started)."""
        self.requests.add(request)
        self._idle.clear()

    def discard(self, request: Endable) -> None:
        """Count a request out (its handler is done)."""
        self.requests.discard(request)
        if not self.requests:
            self._idle.set()

    async def async_stop(self) -> None:
        """Refuse new requests, end those in flight, and wait for them to finish.

        The wait is at most ``STOP_WAIT_S``: a handler still running afterwards is cancelled
        with the HTTP server.
        """
        self.stopping = True
        if not self.requests:
            return
        for request in list(self.requests):
            request.end(stopping_error())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_S):
                await self._idle.wait()


IN_FLIGHT: Final[HassKey[InFlight]] = HassKey(f"{DOMAIN}_gateway_in_flight")


def async_track_in_flight(hass: HomeAssistant) -> InFlight:
    """Start counting the gateway's requests; Home Assistant's stop ends them."""
    in_flight = hass.data[IN_FLIGHT] = InFlight()
    hass.async_add_shutdown_job(HassJob(in_flight.async_stop, f"{DOMAIN} gateway stop"))
    return in_flight
