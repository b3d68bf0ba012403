"""Kept-alive connections the server closes: a request is sent again once, on a new connection.

llama.cpp's server announces keep-alive (``Keep-Alive: timeout=5, max=100``), closes an idle
connection after 5 s, and closes a streamed answer's connection right after its last chunk; a
request written on such a connection just before the close arrives fails before any byte of
the answer (aiohttp's ``ServerDisconnectedError``). ``KeepAliveServer`` (raw asyncio, to control
every byte) makes that race certain: it answers one request per connection with keep-alive
headers, and closes the connection, unanswered, when a second request comes on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
import json
import socket
import struct
from typing import Self

import aiohttp
import pytest

from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.backends.transport import BackendTimeouts
from custom_components.llm_lanes.core.errors import (
    FirstTokenTimeoutError,
    StreamClosedError,
)
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest

TIMEOUTS = BackendTimeouts(connect_s=1.0, request_s=2.0, first_token_s=1.0, idle_s=1.0)
REQUEST = ChatRequest(model="m", messages=(ChatMessage(role="user", content="hi"),))
KEEP_ALIVE = b"Keep-Alive: timeout=5, max=100\r\n"
MODELS = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
EVENTS = (
    {"choices": [{"index": 0, "delta": {"content": "Hello"}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
)


@dataclass
class KeepAliveServer:
    """A loopback HTTP/1.1 server whose connections each answer one request.

    ``answer``: ``"keep-alive"`` answers (JSON, or a chunked event stream for chats) and keeps
    the connection for the next request, which it closes unanswered; ``"close"`` closes every
    connection unanswered; ``"head"`` sends a head announcing a body, then closes; ``"stall"``
    never answers. A request with ``Connection: close`` is answered and its connection closed,
    as llama.cpp's server does.
    """

    answer: str = "keep-alive"
    reset: bool = False
    """Whether a connection is closed with a reset (the client sees ``ClientOSError``)."""
    requests: list[tuple[int, str]] = field(default_factory=list)
    """``(connection number, request line)`` of every request read."""
    dropped: int = 0
    """Requests read on a connection that had answered one, and closed unanswered."""
    url: str = ""
    _connections: int = 0
    _server: asyncio.Server | None = None
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> Self:
        """Start listening on a free loopback port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stop listening and drop every connection."""
        assert self._server is not None
        self._stopped.set()
        self._server.close()
        self._server.close_clients()
        await self._server.wait_closed()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._connections += 1
        number = self._connections
        answered = False
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                line, *fields = head.decode().split("\r\n")
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (f.partition(":") for f in fields if f)
                }
                await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((number, line))
                if answered:
                    self.dropped += 1
                    if self.reset:
                        writer.get_extra_info("socket").setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                        writer.transport.abort()
                    return
                if self.answer == "close":
                    return
                if self.answer == "stall":
                    await self._stopped.wait()
                    return
                closing = headers.get("connection") == "close"
                writer.write(self._head(line, closing))
                if self.answer == "head":
                    await writer.drain()
                    return
                if line.startswith("POST"):
                    for event in (*map(json.dumps, EVENTS), "[DONE]"):
                        data = f"data: {event}\n\n".encode()
                        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(MODELS)
                await writer.drain()
                if closing:
                    return
                answered = True
        except asyncio.IncompleteReadError, ConnectionError:
            pass
        finally:
            writer.close()

    def _head(self, line: str, closing: bool) -> bytes:
        connection = b"Connection: close\r\n" if closing else KEEP_ALIVE
        if line.startswith("POST"):
            return (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n" + connection + b"\r\n"
            )
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n" % len(MODELS) + connection + b"\r\n"
        )


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[KeepAliveServer]:
    """Run a ``KeepAliveServer`` (``answer`` by indirect parametrization, else keep-alive)."""
    async with KeepAliveServer(getattr(request, "param", "keep-alive")) as running:
        yield running


@pytest.fixture
def backend(session: aiohttp.ClientSession, server: KeepAliveServer) -> OpenAIBackend:
    """Build the client of a llama.cpp server at the test server's URL."""
    return OpenAIBackend(
        session, server.url, kind=ServerKind.LLAMA_CPP, timeouts=TIMEOUTS
    )


async def open_connections(backend: OpenAIBackend, count: int) -> None:
    """Make ``count`` calls at once: the session then pools ``count`` idle connections."""
    await asyncio.gather(*(backend.list_models() for _ in range(count)))


async def test_a_call_after_a_burst_goes_out_again_on_a_new_connection(
    backend: OpenAIBackend, server: KeepAliveServer
) -> None:
    """Every pooled connection closes when reused: the call is sent once more, on a new one."""
    await open_connections(backend, 3)

    assert await backend.list_models() == ("m",)
    # aiohttp itself sends a GET again once, on the next pooled connection: closing too.
    assert server.dropped == 2
    assert server.requests[-1][0] == 4  # then a connection of its own


@pytest.mark.parametrize("reset", [False, True])
async def test_a_stream_after_a_burst_goes_out_again_on_a_new_connection(
    backend: OpenAIBackend, server: KeepAliveServer, reset: bool
) -> None:
    """The same for a chat: the caller sees its answer, not "the server closed the connection".

    Closed with a reset, the connection fails with ``ClientOSError`` rather than
    ``ServerDisconnectedError``: the same case.
    """
    server.reset = reset
    await open_connections(backend, 3)

    texts = [chunk.text async for chunk in backend.chat(REQUEST) if chunk.text]
    assert texts == ["Hello"]
    assert server.dropped == 1
    assert server.requests[-1][0] == 4


async def test_a_streamed_answer_connection_is_not_reused(
    backend: OpenAIBackend, server: KeepAliveServer
) -> None:
    """A stream's connection serves it alone, so the next request never meets its close."""
    for _ in range(3):
        assert [chunk.text async for chunk in backend.chat(REQUEST) if chunk.text]
    assert await backend.list_models() == ("m",)

    assert server.dropped == 0
    assert [number for number, _ in server.requests] == [1, 2, 3, 4]


@pytest.mark.parametrize("server", ["close"], indirect=True)
async def test_a_server_that_never_answers_gets_the_request_twice(
    backend: OpenAIBackend, server: KeepAliveServer
) -> None:
    """A second attempt that fails too is the error: a chat is sent twice in all, never more."""
    with pytest.raises(StreamClosedError, match="closed the connection"):
        await anext(aiter(backend.chat(REQUEST)))
    assert len(server.requests) == 2
    assert [number for number, _ in server.requests] == [1, 2]


@pytest.mark.parametrize("server", ["head"], indirect=True)
async def test_an_answer_that_began_is_not_sent_again(
    backend: OpenAIBackend, server: KeepAliveServer
) -> None:
    """Once the head of the answer came, a close is the error: the request went out once."""
    with pytest.raises(StreamClosedError):
        await backend.list_models()
    with pytest.raises(StreamClosedError):
        async for _ in backend.chat(REQUEST):
            pass
    assert len(server.requests) == 2


@pytest.mark.parametrize("server", ["stall"], indirect=True)
async def test_a_first_token_timeout_is_not_sent_again(
    backend: OpenAIBackend, server: KeepAliveServer
) -> None:
    """A server that takes the request and says nothing: the deadline's error, one request."""
    with pytest.raises(FirstTokenTimeoutError):
        await anext(aiter(backend.chat(REQUEST)))
    assert len(server.requests) == 1
