"""HTTP plumbing shared by the backends: JSON calls and streamed answers, with typed errors.

Every call has a deadline: a connect timeout, a total timeout for plain calls, and for streams a
first-token deadline followed by an idle limit between lines. aiohttp and asyncio failures (and
HTTP error statuses, by ``core.errors.http_error``) are turned into the ``BackendError``
subclasses of ``core.errors``; nothing here hangs. A request whose kept-alive connection the
server closed before answering is sent once more, on a new connection (``HttpClient._send``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
import json
import logging
import os
from typing import Any, TypedDict, Unpack

import aiohttp
from aiohttp import hdrs
from yarl import URL

from custom_components.llm_lanes.core.errors import (
    BackendConnectionError,
    BackendError,
    BackendTimeoutError,
    FirstTokenTimeoutError,
    StreamClosedError,
    StreamIdleTimeoutError,
    http_error,
)
from custom_components.llm_lanes.core.model import StreamChunk
from custom_components.llm_lanes.core.protocols.common import StreamDecoder

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendTimeouts:
    """How long a backend waits for the server before it gives up with a typed error."""

    connect_s: float = 10.0
    """Opening the TCP connection."""
    request_s: float = 30.0
    """A whole non-streaming call (server info, models, metrics)."""
    first_token_s: float = 120.0
    """From sending a chat request to its first streamed line (covers a cold model load)."""
    idle_s: float = 60.0
    """The longest silence between two streamed lines once the stream has started."""
    warm_up_s: float = 300.0
    """Loading a model into memory."""


def normalize_base_url(base_url: str) -> str:
    """Strip trailing slashes and a trailing ``/v1`` (added back by the OpenAI client)."""
    return base_url.strip().rstrip("/").removesuffix("/v1")


def _client_timeout(
    timeouts: BackendTimeouts, total: float | None
) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=total, connect=timeouts.connect_s, sock_connect=timeouts.connect_s
    )


def _connection_error(
    err: BaseException, url: str, timeouts: BackendTimeouts
) -> BackendError:
    """Map an aiohttp/asyncio failure that happened before any answer."""
    if isinstance(err, aiohttp.ConnectionTimeoutError):
        return BackendTimeoutError(
            f"connecting to {url} timed out after {timeouts.connect_s:g} s", url=url
        )
    if isinstance(err, aiohttp.ClientConnectorError):
        return BackendConnectionError(
            f"cannot connect to {url}: {_os_reason(err.os_error)}", url=url
        )
    if isinstance(err, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return StreamClosedError(f"{url} closed the connection: {err}", url=url)
    return BackendConnectionError(f"request to {url} failed: {err}", url=url)


def _os_reason(err: OSError) -> str:
    """Say why a connection failed without the address (asyncio's text names host and port)."""
    if err.errno is not None:
        return os.strerror(err.errno)
    return err.strerror or type(err).__name__


def _closed_before_answering(err: aiohttp.ClientError) -> bool:
    """Whether a request failed on a connection that closed before any byte of the answer.

    That is what a pooled keep-alive connection does when the server closes it at the moment
    it is reused: the server read nothing of the request, so sending it again is safe. A
    connection that could not be opened (``ClientConnectorError``) is no such case, nor an
    answer whose head was partly read (the error then carries the parsed message).
    """
    if isinstance(err, aiohttp.ClientConnectorError):
        return False
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return isinstance(err.message, str)
    return True


def _retried(url: str, headers: Mapping[str, str]) -> dict[str, Any]:
    """Return what makes a request's second attempt go out on a new connection of its own.

    aiohttp's pool hands out its oldest idle connection first, and connections a burst opened
    go idle together, so the next pooled connection may be closing as well. aiohttp pools
    connections by host, port, TLS settings and TLS server name: naming the server's host as
    the TLS server name (what TLS uses anyway; plain HTTP ignores it) asks for a connection no
    first attempt uses, and ``Connection: close`` keeps that one out of the pool afterwards.
    """
    return {
        "headers": {**headers, hdrs.CONNECTION: "close"},
        "server_hostname": URL(url).raw_host,
    }


class CallOptions(TypedDict, total=False):
    """What a plain call may carry besides its method and path."""

    json_body: Mapping[str, Any] | None
    """A JSON body to send."""
    timeout_s: float | None
    """The limit on the whole call (``BackendTimeouts.request_s`` when not given)."""
    model: str | None
    """The model the call is about (a 404 naming it is ``ModelNotFoundError``)."""


class ConnectionOptions(TypedDict, total=False):
    """How a client reaches a server besides its session and base URL."""

    timeouts: BackendTimeouts | None
    """How long to wait for the server (``BackendTimeouts()`` when not given)."""
    api_key: str | None
    """A bearer key the server asks for."""


class HttpClient:
    """Thin JSON/streaming client around a caller-owned aiohttp session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        **options: Unpack[ConnectionOptions],
    ) -> None:
        """Bind the session, base URL, timeouts and optional bearer key."""
        self.session = session
        self.base_url = normalize_base_url(base_url)
        self.timeouts = options.get("timeouts") or BackendTimeouts()
        self._headers: dict[str, str] = {}
        if api_key := options.get("api_key"):
            self._headers["Authorization"] = f"Bearer {api_key}"

    def url(self, path: str) -> str:
        """Absolute URL of a server path."""
        return f"{self.base_url}{path}"

    async def _send(
        self,
        method: str,
        url: str,
        *,
        json_body: Mapping[str, Any] | None,
        timeout: aiohttp.ClientTimeout,
        stream: bool = False,
    ) -> aiohttp.ClientResponse:
        """Send a request and wait for the head of its answer.

        A request whose connection closed before any byte of the answer came
        (``_closed_before_answering``) is sent once more, on a new connection (``_retried``).
        Nothing else is sent twice: not a timeout (the caller's deadline covers both attempts),
        not a connection that could not be opened, not an answer that has begun.

        A streamed answer's connection serves that answer only (``Connection: close``):
        llama.cpp's server closes it after the last chunk while announcing keep-alive, so given
        back to the pool it would fail the next request that took it before the close arrived.
        """
        headers = (
            {**self._headers, hdrs.CONNECTION: "close"} if stream else self._headers
        )
        try:
            return await self.session.request(
                method, url, json=json_body, headers=headers, timeout=timeout
            )
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
            if not _closed_before_answering(err):
                raise
            _LOGGER.debug(
                "%s closed the connection before answering (%s); sending again on a new one",
                url,
                err,
            )
        return await self.session.request(
            method, url, json=json_body, timeout=timeout, **_retried(url, headers)
        )

    async def request_text(
        self, method: str, path: str, **options: Unpack[CallOptions]
    ) -> str:
        """Make a plain call and return the body; raise a typed error on any failure."""
        url = self.url(path)
        total = options.get("timeout_s") or self.timeouts.request_s
        try:
            response = await self._send(
                method,
                url,
                json_body=options.get("json_body"),
                timeout=_client_timeout(self.timeouts, total),
            )
            async with response:
                body = await response.text(errors="replace")
                if response.status >= 400:
                    raise http_error(
                        response.status, body, url=url, model=options.get("model")
                    )
                return body
        except BackendError:
            raise
        except aiohttp.ConnectionTimeoutError as err:
            raise _connection_error(err, url, self.timeouts) from err
        except TimeoutError as err:
            raise BackendTimeoutError(
                f"{url} did not answer within {total:g} s", url=url
            ) from err
        except aiohttp.ClientError as err:
            raise _connection_error(err, url, self.timeouts) from err

    async def request_json(
        self, method: str, path: str, **options: Unpack[CallOptions]
    ) -> Any:
        """Make a plain call and decode its JSON body."""
        body = await self.request_text(method, path, **options)
        try:
            return json.loads(body)
        except ValueError as err:
            raise BackendError(
                f"{self.url(path)} answered something that is not JSON: {body[:80]!r}"
            ) from err

    async def get_json(self, path: str) -> Any:
        """GET a JSON document."""
        return await self.request_json("GET", path)

    async def load_model(self, path: str, body: Mapping[str, Any], model: str) -> Any:
        """POST a request that loads ``model``: within ``warm_up_s``, not the plain-call limit."""
        return await self.request_json(
            "POST", path, json_body=body, timeout_s=self.timeouts.warm_up_s, model=model
        )

    async def stream_chunks(
        self,
        path: str,
        body: Mapping[str, Any],
        decoder: StreamDecoder,
        *,
        model: str | None = None,
    ) -> AsyncGenerator[StreamChunk]:
        """POST ``body`` and yield the answer that ``decoder`` reads from the streamed lines.

        Closing the generator early closes the connection (the server stops generating).
        """
        async with self.stream_lines(path, body, model=model) as lines:
            async for line in lines:
                chunks = decoder.feed(line)
                if decoder.started:
                    lines.token_seen()
                for chunk in chunks:
                    yield chunk
                if decoder.done:
                    return
        yield decoder.end()

    @asynccontextmanager
    async def stream_lines(
        self, path: str, body: Mapping[str, Any], *, model: str | None = None
    ) -> AsyncIterator[StreamLines]:
        """POST ``body`` and yield the response's non-empty lines (see ``StreamLines``).

        Leaving the block early closes the connection, which is how the server learns the
        request was cancelled.
        """
        url = self.url(path)
        timeouts = self.timeouts
        loop = asyncio.get_running_loop()
        first_deadline = loop.time() + timeouts.first_token_s
        try:
            async with asyncio.timeout_at(first_deadline):
                response = await self._send(
                    "POST",
                    url,
                    json_body=body,
                    timeout=_client_timeout(timeouts, None),
                    stream=True,
                )
        except aiohttp.ConnectionTimeoutError as err:
            raise _connection_error(err, url, timeouts) from err
        except TimeoutError as err:
            raise FirstTokenTimeoutError(
                f"{url} sent nothing within {timeouts.first_token_s:g} s", url=url
            ) from err
        except aiohttp.ClientError as err:
            raise _connection_error(err, url, timeouts) from err
        try:
            if response.status >= 400:
                try:
                    async with asyncio.timeout(timeouts.request_s):
                        text = await response.text(errors="replace")
                except TimeoutError, aiohttp.ClientError:
                    text = ""
                raise http_error(response.status, text, url=url, model=model)
            yield StreamLines(response, url, timeouts, first_deadline)
        finally:
            # Closing (not releasing) drops the connection, so the server stops generating.
            response.close()


class StreamLines:
    """The non-empty lines of a streamed answer, with the first-token and idle deadlines.

    Until the backend calls ``token_seen`` (its first text or tool call), every line must come
    before the first-token deadline: servers send role-only or keep-alive lines before the
    first token, and those do not count. Afterwards each line must follow the previous one
    within ``idle_s``.
    """

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        url: str,
        timeouts: BackendTimeouts,
        first_deadline: float,
    ) -> None:
        """Wrap an open response."""
        self._response = response
        self._url = url
        self._timeouts = timeouts
        self._first_deadline: float | None = first_deadline

    def token_seen(self) -> None:
        """Switch from the first-token deadline to the idle limit."""
        self._first_deadline = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        """Iterate over the lines."""
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes]:
        timeouts = self._timeouts
        url = self._url
        while True:
            first_deadline = self._first_deadline
            try:
                if first_deadline is not None:
                    async with asyncio.timeout_at(first_deadline):
                        line = await self._response.content.readline()
                else:
                    async with asyncio.timeout(timeouts.idle_s):
                        line = await self._response.content.readline()
            except TimeoutError as err:
                if first_deadline is not None:
                    raise FirstTokenTimeoutError(
                        f"{url} sent no first token within {timeouts.first_token_s:g} s",
                        url=url,
                    ) from err
                raise StreamIdleTimeoutError(
                    f"the stream from {url} was silent for more than {timeouts.idle_s:g} s",
                    url=url,
                ) from err
            except aiohttp.ClientError as err:
                raise StreamClosedError(
                    f"{url} closed the stream early: {err}", url=url
                ) from err
            if not line:
                return  # end of body; the caller decides whether it was complete
            stripped = line.strip()
            if stripped:
                yield stripped
