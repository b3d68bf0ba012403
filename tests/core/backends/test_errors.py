"""Every failure becomes a typed error with a clear message, never a hang.

Each test runs a real loopback server that misbehaves on purpose (or no server at all).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
import contextlib
import json
import socket

import aiohttp
from aiohttp import web
import pytest

from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.ollama import OllamaBackend
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.backends.transport import BackendTimeouts
from custom_components.llm_lanes.core.errors import (
    AuthError,
    BackendConnectionError,
    BackendError,
    BackendHTTPError,
    BackendTimeoutError,
    EmbeddingsUnsupportedError,
    FirstTokenTimeoutError,
    MalformedStreamError,
    ModelNotFoundError,
    ServerBusyError,
    StreamClosedError,
    StreamIdleTimeoutError,
    ToolsUnsupportedError,
)
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest, StreamChunk

from .conftest import Handler, Serve, json_handler, lines_handler, stall_until_released

FAST = BackendTimeouts(connect_s=0.5, request_s=2.0, first_token_s=0.5, idle_s=0.3)
REQUEST = ChatRequest(model="m", messages=(ChatMessage(role="user", content="hi"),))
OLLAMA_LINE = json.dumps(
    {"message": {"role": "assistant", "content": "Hel"}, "done": False}
)
SSE_LINE = "data: " + json.dumps(
    {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}
)


def make_backend(session: aiohttp.ClientSession, url: str, api: str) -> Backend:
    """Build the client for ``api`` ("ollama" or "openai") with short timeouts."""
    if api == "ollama":
        return OllamaBackend(session, url, timeouts=FAST)
    return OpenAIBackend(session, url, kind=ServerKind.LLAMA_CPP, timeouts=FAST)


def chat_path(api: str) -> str:
    """Where each API takes chats."""
    return "/api/chat" if api == "ollama" else "/v1/chat/completions"


async def collect(stream: AsyncIterator[StreamChunk], into: list[StreamChunk]) -> None:
    """Drain a stream into a list (so a test can see what came before an error)."""
    async for chunk in stream:
        into.append(chunk)  # noqa: PERF401 (a comprehension would lose what came before an error)


async def stall(request: web.Request) -> web.StreamResponse:
    """Accept the request and never answer (until the test is over)."""
    await stall_until_released(request)
    return web.Response(status=204)


def stream_then(lines: list[str], after: str) -> Handler:
    """Stream ``lines`` (as plain text), then stall, end the body, or drop the connection."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for line in lines:
            await response.write(line.encode() + b"\n")
        if after == "stall":
            await stall_until_released(request)
        if after == "drop":
            assert request.transport is not None
            request.transport.abort()
            return response
        await response.write_eof()
        return response

    return handler


StreamingBackend = Callable[[str, list[str], str], Awaitable[Backend]]


@pytest.fixture
def streaming_backend(session: aiohttp.ClientSession, serve: Serve) -> StreamingBackend:
    """Make the client of an API whose server streams lines, then does what ``stream_then`` says."""

    async def make(api: str, lines: list[str], after: str) -> Backend:
        server = await serve({f"POST {chat_path(api)}": stream_then(lines, after)})
        return make_backend(session, server.url, api)

    return make


@pytest.fixture
def free_port() -> int:
    """Find a loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """Open a loopback port whose listen queue is full: new connections are never completed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port: int = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    yield port
    for filler in fillers:
        filler.close()
    listener.close()


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_connection_refused(
    session: aiohttp.ClientSession, free_port: int, api: str
) -> None:
    """Nothing listening: BackendConnectionError naming the URL (once: the reason is the OS's)."""
    url = f"http://127.0.0.1:{free_port}"
    backend = make_backend(session, url, api)
    with pytest.raises(BackendConnectionError) as refused:
        await collect(backend.chat(REQUEST), [])
    assert refused.value.message.startswith(f"cannot connect to {url}/")
    assert refused.value.message.endswith(": Connection refused")
    with pytest.raises(BackendConnectionError, match="cannot connect"):
        await backend.list_models()


async def test_connect_timeout(
    session: aiohttp.ClientSession, full_backlog: int
) -> None:
    """A server that never completes the TCP handshake: a timeout after connect_s."""
    timeouts = BackendTimeouts(connect_s=0.3, first_token_s=5.0)
    backend = OpenAIBackend(
        session, f"http://127.0.0.1:{full_backlog}", timeouts=timeouts
    )
    with pytest.raises(
        BackendTimeoutError, match=r"connecting to .* timed out after 0\.3 s"
    ):
        await collect(backend.chat(REQUEST), [])


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_never_answers(
    session: aiohttp.ClientSession, serve: Serve, api: str
) -> None:
    """The server takes the request and sends nothing: FirstTokenTimeoutError."""
    server = await serve({f"POST {chat_path(api)}": stall})
    backend = make_backend(session, server.url, api)
    with pytest.raises(FirstTokenTimeoutError, match=r"sent nothing within 0\.5 s"):
        await collect(backend.chat(REQUEST), [])


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_headers_but_no_first_token(
    streaming_backend: StreamingBackend, api: str
) -> None:
    """Headers arrive, no line follows: FirstTokenTimeoutError too."""
    backend = await streaming_backend(api, [], "stall")
    with pytest.raises(FirstTokenTimeoutError, match=r"no first token within 0\.5 s"):
        await collect(backend.chat(REQUEST), [])


@pytest.mark.parametrize(
    ("api", "line"),
    [
        (
            "ollama",
            json.dumps(
                {"message": {"role": "assistant", "content": ""}, "done": False}
            ),
        ),
        (
            "openai",
            "data: "
            + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
        ),
    ],
)
async def test_lines_without_a_token_do_not_count(
    streaming_backend: StreamingBackend, api: str, line: str
) -> None:
    """A role-only line, then silence: still a first-token timeout, not an idle one."""
    backend = await streaming_backend(api, [line], "stall")
    with pytest.raises(FirstTokenTimeoutError, match=r"no first token within 0\.5 s"):
        await collect(backend.chat(REQUEST), [])


@pytest.mark.parametrize(
    ("api", "line"), [("ollama", OLLAMA_LINE), ("openai", SSE_LINE)]
)
async def test_stall_mid_stream(
    streaming_backend: StreamingBackend, api: str, line: str
) -> None:
    """One token, then silence: StreamIdleTimeoutError after the chunk was delivered."""
    backend = await streaming_backend(api, [line], "stall")
    chunks: list[StreamChunk] = []
    with pytest.raises(StreamIdleTimeoutError, match=r"silent for more than 0\.3 s"):
        await collect(backend.chat(REQUEST), chunks)
    assert [chunk.text for chunk in chunks] == ["Hel"]


@pytest.mark.parametrize(
    ("api", "garbage", "message"),
    [
        ("ollama", "<html>oops</html>", "not JSON"),
        ("ollama", "[1, 2]", "not an object"),
        ("openai", "garbage without a field", "not a server-sent event"),
        ("openai", "data: {broken", "event that is not JSON"),
    ],
)
async def test_garbage_lines(
    streaming_backend: StreamingBackend, api: str, garbage: str, message: str
) -> None:
    """A line that cannot be parsed: MalformedStreamError quoting it."""
    line = OLLAMA_LINE if api == "ollama" else SSE_LINE
    backend = await streaming_backend(api, [line, garbage], "end")
    with pytest.raises(MalformedStreamError, match=message):
        await collect(backend.chat(REQUEST), [])


@pytest.mark.parametrize(
    ("api", "line"), [("ollama", OLLAMA_LINE), ("openai", SSE_LINE)]
)
@pytest.mark.parametrize("after", ["drop", "end"])
async def test_closed_mid_stream(
    streaming_backend: StreamingBackend, api: str, line: str, after: str
) -> None:
    """The connection drops (or the body ends) before the server said done: StreamClosedError."""
    backend = await streaming_backend(api, [line], after)
    chunks: list[StreamChunk] = []
    with pytest.raises(StreamClosedError, match="closed the stream"):
        await collect(backend.chat(REQUEST), chunks)
    assert [chunk.text for chunk in chunks] == ["Hel"]


# Bodies as the servers send them.
OLLAMA_BUSY = {
    "error": "server busy, please try again.  maximum pending requests exceeded"
}
OLLAMA_NO_MODEL = {"error": 'model "m" not found, try pulling it first'}
LLAMA_CPP_NO_JINJA = {
    "error": {
        "code": 500,
        "message": "tools param requires --jinja flag",
        "type": "server_error",
    }
}
VLLM_UNAUTHORIZED = {"error": "Unauthorized"}


@pytest.mark.parametrize(
    ("api", "status", "body", "error", "message"),
    [
        (
            "ollama",
            503,
            OLLAMA_BUSY,
            ServerBusyError,
            "is busy .HTTP 503.: server busy",
        ),
        ("openai", 429, {"error": "slow down"}, ServerBusyError, "is busy .HTTP 429."),
        (
            "ollama",
            404,
            OLLAMA_NO_MODEL,
            ModelNotFoundError,
            "model 'm' is not available",
        ),
        (
            "openai",
            500,
            LLAMA_CPP_NO_JINJA,
            ToolsUnsupportedError,
            "cannot use tools .*--jinja",
        ),
        (
            "openai",
            400,
            LLAMA_CPP_NO_JINJA,
            ToolsUnsupportedError,
            "requires --jinja flag",
        ),
        (
            "openai",
            401,
            VLLM_UNAUTHORIZED,
            AuthError,
            "refused the request .HTTP 401.: Unauthorized",
        ),
        (
            "openai",
            400,
            {"error": {"message": "bad"}},
            BackendHTTPError,
            "answered HTTP 400: bad",
        ),
        (
            "ollama",
            400,
            {"error": "this model does not support embeddings"},
            EmbeddingsUnsupportedError,
            "computes no embeddings .*embedding model",
        ),
    ],
)
async def test_http_errors(  # noqa: PLR0917
    session: aiohttp.ClientSession,
    serve: Serve,
    api: str,
    status: int,
    body: dict[str, object],
    error: type[BackendHTTPError],
    message: str,
) -> None:
    """HTTP error statuses become the matching typed error with the server's own words."""
    server = await serve({f"POST {chat_path(api)}": json_handler(body, status)})
    backend = make_backend(session, server.url, api)
    with pytest.raises(error, match=message) as caught:
        await collect(backend.chat(REQUEST), [])
    assert type(caught.value) is error
    assert caught.value.status == status
    assert caught.value.placeholders["status"] == str(status)


async def test_error_inside_ollama_stream(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """Ollama can report an error as a stream line after the 200 status."""
    lines = [OLLAMA_LINE, json.dumps(OLLAMA_NO_MODEL)]
    server = await serve({"POST /api/chat": lines_handler(lines)})
    backend = make_backend(session, server.url, "ollama")
    with pytest.raises(ModelNotFoundError, match="not found, try pulling it first"):
        await collect(backend.chat(REQUEST), [])


async def test_error_inside_sse_stream(
    session: aiohttp.ClientSession, serve: Serve
) -> None:
    """llama.cpp reports errors after the stream started as an ``error:`` event."""
    lines = [SSE_LINE, 'error: {"code": 500, "message": "slot unavailable"}']
    server = await serve(
        {"POST /v1/chat/completions": lines_handler(lines, "text/event-stream")}
    )
    backend = make_backend(session, server.url, "openai")
    with pytest.raises(BackendHTTPError, match="slot unavailable") as caught:
        await collect(backend.chat(REQUEST), [])
    assert caught.value.status == 500


async def test_plain_call_timeout(session: aiohttp.ClientSession, serve: Serve) -> None:
    """A non-streaming call that never answers times out after request_s."""
    server = await serve({"GET /api/tags": stall})
    backend = OllamaBackend(
        session, server.url, timeouts=BackendTimeouts(request_s=0.3, connect_s=0.5)
    )
    with pytest.raises(BackendTimeoutError, match=r"did not answer within 0\.3 s"):
        await backend.list_models()


async def test_errors_carry_translation_keys() -> None:
    """Each backend error has the translation key the integration maps it with."""
    assert BackendConnectionError("x").translation_key == "cannot_connect"
    assert FirstTokenTimeoutError("x").translation_key == "server_timeout"
    assert ServerBusyError("x", status=503).translation_key == "server_busy"
    assert isinstance(StreamClosedError("x"), BackendError)
