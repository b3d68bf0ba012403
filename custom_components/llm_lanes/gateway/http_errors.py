"""The gateway's HTTP errors: what each engine error answers, in the shape of each API.

An error carries its status, a message for the client, OpenAI's ``type`` / ``code`` / ``param``
and, for a client that should come back later, ``Retry-After`` (every 503 has one: it is
always a "later"). ``http_error_of`` is the one mapping from ``core.errors`` to statuses; no
engine error becomes a 500.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final

from aiohttp import hdrs, web

from custom_components.llm_lanes.core.errors import (
    AuthError,
    BackendConnectionError,
    BackendHTTPError,
    BackendTimeoutError,
    EmbeddingsUnsupportedError,
    InvalidRequestError,
    LanesError,
    LimitExceededError,
    ModelNotFoundError,
    QueueFullError,
    QueueTimeoutError,
    QuotaExceededError,
    SchedulerClosedError,
    ServerBusyError,
    ToolsUnsupportedError,
)
from custom_components.llm_lanes.core.protocols import ollama_answers, openai_answers
from custom_components.llm_lanes.core.quotas import BUCKET_S

QUEUE_RETRY_AFTER_S: Final = 2
"""When a client whose lane queue is full (or whose server is busy) may try again."""
UNAVAILABLE_RETRY_AFTER_S: Final = 10
"""When a client may try again whose server does not answer, is not set up or is reloading, or
whose Home Assistant is stopping: the server is polled every few seconds while it is down, and
an entry reloads in seconds."""
QUOTA_RETRY_AFTER_S: Final = int(BUCKET_S)
"""When a client over its daily quota may try again: the rolling budget frees five minutes of
use at a time."""

INVALID_REQUEST: Final = "invalid_request_error"
AUTHENTICATION: Final = "authentication_error"
NOT_FOUND: Final = "not_found_error"
NOT_SUPPORTED: Final = "not_supported_error"
RATE_LIMIT: Final = "rate_limit_error"
UNAVAILABLE: Final = "server_error"


class GatewayError(Exception):
    """A request the gateway answers with an error status."""

    def __init__(
        self,
        status: HTTPStatus,
        message: str,
        *,
        kind: str = INVALID_REQUEST,
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Describe the error (``kind``: OpenAI's error type)."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param
        self.retry_after = retry_after


def unauthorized(*, ollama: bool = False) -> GatewayError:
    """Refuse a key that is missing or matches no client (``ollama``: the key is in the URL)."""
    message = (
        "invalid or missing API key: the host URL must end with a client key of LLM Lanes "
        "(.../api/llm_lanes/ollama/<client key>)"
        if ollama
        else "invalid or missing API key (a client key of LLM Lanes, or a Home Assistant "
        "access token)"
    )
    return GatewayError(
        HTTPStatus.UNAUTHORIZED, message, kind=AUTHENTICATION, code="invalid_api_key"
    )


def model_not_found(model: str) -> GatewayError:
    """Refuse a model the server behind does not serve."""
    return GatewayError(
        HTTPStatus.NOT_FOUND,
        f"model {model!r} is not served here",
        kind=NOT_FOUND,
        code="model_not_found",
        param="model",
    )


def unknown_endpoint(method: str, path: str) -> GatewayError:
    """Refuse a path neither API has (``path`` as the client may see it: no key in it)."""
    return GatewayError(
        HTTPStatus.NOT_FOUND,
        f"no such endpoint: {method} {path}",
        kind=NOT_FOUND,
        code="unknown_endpoint",
    )


def unavailable(message: str) -> GatewayError:
    """Refuse a request the server behind cannot take now (down, not set up)."""
    return GatewayError(
        HTTPStatus.SERVICE_UNAVAILABLE,
        message,
        kind=UNAVAILABLE,
        code="server_unavailable",
        retry_after=UNAVAILABLE_RETRY_AFTER_S,
    )


def _limit_error(err: LimitExceededError) -> GatewayError:
    prompt = err.limit == "max_prompt_tokens"
    return GatewayError(
        HTTPStatus.BAD_REQUEST,
        err.message if prompt else err.naming("max_tokens").message,
        code="context_length_exceeded" if prompt else "invalid_value",
        param="messages" if prompt else "max_tokens",
    )


def _backend_http_error(err: BackendHTTPError) -> GatewayError:
    """Pass a status the server answered for the client's own mistake; the rest is a bad gateway."""
    if 400 <= err.status < 500 and err.status not in {401, 403, 404, 429}:
        return GatewayError(HTTPStatus(err.status), err.message, code="server_refused")
    return GatewayError(
        HTTPStatus.BAD_GATEWAY, err.message, kind=UNAVAILABLE, code="server_error"
    )


_STATUSES: tuple[
    tuple[type[LanesError], HTTPStatus, str, str, str | None, int | None], ...
] = (
    # error                 status                          type             code                  param    Retry-After
    (QueueFullError,        HTTPStatus.TOO_MANY_REQUESTS,   RATE_LIMIT,      "queue_full",         None,    QUEUE_RETRY_AFTER_S),
    (QuotaExceededError,    HTTPStatus.TOO_MANY_REQUESTS,   RATE_LIMIT,      "quota_exceeded",     None,    QUOTA_RETRY_AFTER_S),
    (QueueTimeoutError,     HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE,     "queue_timeout",      None,    QUEUE_RETRY_AFTER_S),
    (SchedulerClosedError,  HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE,     "server_unavailable", None,    UNAVAILABLE_RETRY_AFTER_S),
    (ModelNotFoundError,    HTTPStatus.NOT_FOUND,           NOT_FOUND,       "model_not_found",    "model", None),
    (ToolsUnsupportedError, HTTPStatus.BAD_REQUEST,         INVALID_REQUEST, "tools_unsupported",  "tools", None),
    (EmbeddingsUnsupportedError, HTTPStatus.NOT_IMPLEMENTED, NOT_SUPPORTED, "embeddings_unsupported", None, None),
    (ServerBusyError,       HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE,     "server_busy",        None,    QUEUE_RETRY_AFTER_S),
    (AuthError,             HTTPStatus.BAD_GATEWAY,         UNAVAILABLE,     "server_auth",        None,    None),
    (BackendConnectionError, HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE,    "server_unavailable", None,    UNAVAILABLE_RETRY_AFTER_S),
    (BackendTimeoutError,   HTTPStatus.GATEWAY_TIMEOUT,     UNAVAILABLE,     "timeout",            None,    None),
)  # fmt: skip
"""Engine errors and what they answer, most specific first (the server's own statuses after)."""


_ADVICE: Final = {
    "server_unavailable": "try again later; Home Assistant's log says why",
    "server_error": "Home Assistant's log has the details",
    "timeout": "try again later; Home Assistant's log has the details",
}
"""What a client can do about a server's failure (its owner reads the rest in the log)."""


def http_error_of(err: LanesError) -> GatewayError:
    """Return the HTTP error of an engine error (a bad gateway for whatever is not listed).

    Its message names the server by the address in the engine error: ``addresses`` names it
    by its title before a client reads it.
    """
    error = _http_error_of(err)
    if (advice := _ADVICE.get(error.code or "")) is not None:
        error.message = f"{error.message}; {advice}"
    return error


def _http_error_of(err: LanesError) -> GatewayError:
    if isinstance(err, InvalidRequestError):
        return GatewayError(
            HTTPStatus.BAD_REQUEST, err.message, code="invalid_value", param=err.field
        )
    if isinstance(err, LimitExceededError):
        return _limit_error(err)
    for kind, status, error_type, code, param, retry_after in _STATUSES:
        if isinstance(err, kind):
            return GatewayError(
                status,
                err.message,
                kind=error_type,
                code=code,
                param=param,
                retry_after=retry_after,
            )
    if isinstance(err, BackendHTTPError):
        return _backend_http_error(err)
    return GatewayError(
        HTTPStatus.BAD_GATEWAY, err.message, kind=UNAVAILABLE, code="server_error"
    )


@dataclass(frozen=True, slots=True)
class Wire:
    """How one API writes errors, and the lines of its streams."""

    stream_content_type: str
    error_body: Callable[[GatewayError], dict[str, Any]]
    line: Callable[[Mapping[str, Any]], bytes]

    def error_response(self, err: GatewayError) -> web.Response:
        """Answer ``err`` with its status (and ``Retry-After``)."""
        headers = {}
        if err.retry_after is not None:
            headers[hdrs.RETRY_AFTER] = str(err.retry_after)
        return web.json_response(
            self.error_body(err), status=err.status, headers=headers
        )

    def error_line(self, err: GatewayError) -> bytes:
        """Write ``err`` as a line of a stream that has started (its status is sent already)."""
        return self.line(self.error_body(err))


OPENAI_WIRE: Final = Wire(
    stream_content_type="text/event-stream",
    error_body=lambda err: openai_answers.error_body(
        err.message, kind=err.kind, code=err.code, param=err.param
    ),
    line=openai_answers.sse_event,
)
OLLAMA_WIRE: Final = Wire(
    stream_content_type="application/x-ndjson",
    error_body=lambda err: ollama_answers.error_body(err.message),
    line=ollama_answers.ndjson_line,
)
