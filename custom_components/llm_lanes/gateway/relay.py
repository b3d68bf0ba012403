"""Between a client's HTTP connection and the scheduler: the body in, the answer out.

``read_json`` reads a body up to ``MAX_BODY_BYTES``. ``relay`` waits for the answer's first
chunk before it sends a status (so a refusal or a server error is still a status of its own),
then streams chunk by chunk, flushing each, or gathers the whole answer. ``watch_request``
notices a client that goes away, while it waits in the queue as while it streams: Home
Assistant's server cancels the handler itself then, but other aiohttp servers (its test
server among them) do not, so the connection is checked a few times a second and the handler
cancelled. Either way leaving the handler closes the scheduler stream, which frees the request's
queue place or slot and cancels it at the server. The same watch ends the request with an error
when Home Assistant stops (``in_flight``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from http import HTTPStatus
import logging
from types import TracebackType
from typing import Any, Final

from aiohttp import hdrs, web
from homeassistant.helpers.http import KEY_HASS
from homeassistant.util.json import json_loads

from custom_components.llm_lanes.core.errors import LanesError
from custom_components.llm_lanes.core.model import StreamChunk, TokenUsage
from custom_components.llm_lanes.core.protocols.common import StreamEncoder
from custom_components.llm_lanes.gateway.addresses import for_client
from custom_components.llm_lanes.gateway.auth import Caller
from custom_components.llm_lanes.gateway.http_errors import (
    GatewayError,
    Wire,
    http_error_of,
    unknown_endpoint,
)
from custom_components.llm_lanes.gateway.in_flight import (
    IN_FLIGHT,
    InFlight,
    stopping_error,
)

_LOGGER = logging.getLogger(__name__)

MAX_BODY_BYTES: Final = 8 * 1024 * 1024
"""The largest request body taken (a larger one is answered 413)."""
DISCONNECT_POLL_S: Final = 0.25
"""How often the connection of a waiting or streaming request is checked."""


class ClientDisconnectedError(Exception):
    """The client closed its connection before its answer was complete."""


type Handler = Callable[[web.Request, Caller], Awaitable[web.StreamResponse]]
"""Answers one endpoint of an API for an authenticated caller."""


async def serve(
    request: web.Request,
    wire: Wire,
    authenticate: Callable[[], Awaitable[Caller]],
    handler: Handler | None,
    path: str,
) -> web.StreamResponse:
    """Authenticate, then answer with ``handler`` (None: 404 for ``path``).

    Errors are answered in the API's shape; the request is watched (``watch_request``): its
    client may disconnect, Home Assistant may stop.
    """
    try:
        with watch_request(request, request.app[KEY_HASS].data[IN_FLIGHT]):
            caller = await authenticate()
            if handler is None:
                raise unknown_endpoint(request.method, path)
            return await handler(request, caller)
    except GatewayError as err:
        return wire.error_response(for_client(request.app[KEY_HASS], err))
    except LanesError as err:
        return wire.error_response(
            for_client(request.app[KEY_HASS], http_error_of(err))
        )
    except ClientDisconnectedError:
        _LOGGER.debug("A gateway client went away before its answer was complete")
        # Nobody reads it: the connection is closed.
        return web.Response(status=HTTPStatus.NO_CONTENT)


async def read_json(request: web.Request) -> Any:
    """Read the request's JSON body (413 past ``MAX_BODY_BYTES``, 400 when not JSON)."""
    too_large = GatewayError(
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        f"the request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB",
        code="request_too_large",
    )
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise too_large
    body = bytearray()
    async for piece in request.content.iter_any():
        body += piece
        if len(body) > MAX_BODY_BYTES:
            raise too_large
    try:
        return json_loads(body)
    except ValueError as err:
        raise GatewayError(
            HTTPStatus.BAD_REQUEST, f"the body is not JSON: {err}", code="invalid_json"
        ) from err


class watch_request:  # noqa: N801 (used like contextlib's context managers)
    """Watch a request while it is answered: its client may go away, Home Assistant may stop.

    A client that disconnects cancels the handler, which the block raises as
    ``ClientDisconnectedError``. The request is counted in ``in_flight`` for its duration, and
    ended by it when Home Assistant stops (``end``): the handler is cancelled, and the block
    raises the error it was ended with (a 503 answered in the API's shape), unless the answer
    has begun: ``relay`` then takes it (``take_end``) and writes it as the stream's last line.
    A request that comes once Home Assistant is stopping is refused with that error at once.
    """

    __slots__ = (
        "_ended",
        "_gone",
        "_handle",
        "_in_flight",
        "_loop",
        "_request",
        "_task",
    )

    def __init__(self, request: web.Request, in_flight: InFlight) -> None:
        """Watch ``request`` (from the task that handles it), counted in ``in_flight``."""
        self._request = request
        self._in_flight = in_flight
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._gone = False
        self._ended: GatewayError | None = None
        self._handle: asyncio.TimerHandle | None = None

    def __enter__(self) -> None:
        """Start watching (or refuse the request: Home Assistant is stopping)."""
        if self._in_flight.stopping:
            raise stopping_error()
        self._in_flight.add(self)
        self._request[WATCH] = self
        self._handle = self._loop.call_later(DISCONNECT_POLL_S, self._check)

    def _check(self) -> None:
        transport = self._request.transport
        if transport is None or transport.is_closing():
            self._gone = True
            self._handle = None
            self._task.cancel()
            return
        self._handle = self._loop.call_later(DISCONNECT_POLL_S, self._check)

    def end(self, error: GatewayError) -> None:
        """End the request with ``error``: its handler is cancelled (once)."""
        if self._ended is None and not self._gone:
            self._ended = error
            self._task.cancel()

    def take_end(self) -> GatewayError | None:
        """Return the error the request was ended with, taking over its cancellation.

        None when the request was not ended (the cancellation is someone else's).
        """
        error, self._ended = self._ended, None
        if error is not None:
            self._task.uncancel()
        return error

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop watching; a cancellation this watch caused becomes its error."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._in_flight.discard(self)
        if not isinstance(exc, asyncio.CancelledError):
            return
        if self._gone and self._task.uncancel() == 0:
            raise ClientDisconnectedError from None
        if (error := self.take_end()) is not None and self._task.cancelling() == 0:
            raise error from None


WATCH: Final = web.RequestKey("llm_lanes_watch", watch_request)
"""Where a request's ``watch_request`` is, for ``relay``."""


async def relay(
    request: web.Request,
    chunks: AsyncGenerator[StreamChunk],
    *,
    encoder: StreamEncoder,
    stream: bool,
    wire: Wire,
) -> web.StreamResponse:
    """Answer with the chunks of a scheduler stream: streamed, or whole at the end.

    An engine error before the first chunk is the answer's status; one after it, in a stream,
    is the stream's last line.
    """
    async with aclosing(chunks):
        first = await first_chunk(chunks)
        if not stream:
            encoder.feed(first)
            try:
                async for chunk in chunks:
                    encoder.feed(chunk)
            except LanesError as err:
                raise http_error_of(err) from err
            return web.json_response(encoder.answer())
        response = web.StreamResponse(
            headers={
                hdrs.CONTENT_TYPE: wire.stream_content_type,
                hdrs.CACHE_CONTROL: "no-cache",
            }
        )
        await response.prepare(request)
        try:
            await response.write(encoder.encode(first))
            async for chunk in chunks:
                await response.write(encoder.encode(chunk))
        except LanesError as err:
            error = for_client(request.app[KEY_HASS], http_error_of(err))
            await response.write(wire.error_line(error))
        except ConnectionResetError as err:
            raise ClientDisconnectedError from err
        except asyncio.CancelledError:
            if (ended := request[WATCH].take_end()) is None:
                raise
            await response.write(wire.error_line(ended))
        await response.write_eof()
        return response


async def first_chunk(chunks: AsyncGenerator[StreamChunk]) -> StreamChunk:
    """Wait for the first chunk of an answer (admission, then the server's first token)."""
    try:
        return await anext(chunks)
    except LanesError as err:
        raise http_error_of(err) from err
    except StopAsyncIteration as err:
        raise GatewayError(
            HTTPStatus.BAD_GATEWAY,
            "the answer ended before it began",
            kind="server_error",
        ) from err


async def embeddings_of(
    chunks: AsyncGenerator[StreamChunk],
) -> tuple[tuple[Sequence[float], ...], TokenUsage | None]:
    """Wait for the answer to an embeddings request: its vectors and its usage."""
    async with aclosing(chunks):
        answer = [await first_chunk(chunks)]
        try:
            answer += [chunk async for chunk in chunks]
        except LanesError as err:
            raise http_error_of(err) from err
    vectors = next((chunk.embeddings for chunk in answer if chunk.embeddings), ())
    return vectors, answer[-1].usage
