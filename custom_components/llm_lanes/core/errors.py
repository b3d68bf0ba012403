"""Typed errors of the engine, and the typed error for an error a server answers with.

Each carries a ``translation_key`` and placeholders so the integration can turn it into a
translated Home Assistant error without string matching.
"""

from __future__ import annotations

import json
from typing import Final

_BODY_EXCERPT = 300


class LanesError(Exception):
    """Base of every error the engine raises."""

    translation_key = "unknown_error"

    def __init__(self, message: str, **placeholders: str) -> None:
        """Store the message and the placeholders used by translations."""
        super().__init__(message)
        self.message = message
        self.placeholders: dict[str, str] = {"message": message, **placeholders}


# --- scheduler ---------------------------------------------------------------------------------


class SchedulerError(LanesError):
    """The scheduler refused or dropped a request."""


class LimitExceededError(SchedulerError):
    """A request breaks a lane limit (context, output tokens); nothing was sent to the server."""

    translation_key = "limit_exceeded"

    def __init__(self, *, lane: str, limit: str, value: float, maximum: float) -> None:
        """Describe which limit of which lane was broken, and by what value."""
        super().__init__(
            f"{limit} of {value} exceeds the {lane} lane's limit of {maximum}",
            lane=lane,
            limit=limit,
            value=str(value),
            maximum=str(maximum),
        )
        self.lane = lane
        self.limit = limit
        self.value = value
        self.maximum = maximum

    def naming(self, field: str) -> LimitExceededError:
        """Return the same refusal worded with the field the caller set (``max_tokens``).

        The lane's limit is ``max_output_tokens``; a caller who asked with another field's name
        (the ``generate`` action, OpenAI's ``max_tokens``) is told that name.
        """
        return LimitExceededError(
            lane=self.lane, limit=field, value=self.value, maximum=self.maximum
        )


class QueueFullError(SchedulerError):
    """The lane's queue holds its maximum number of waiting requests."""

    translation_key = "queue_full"

    def __init__(self, *, lane: str, max_queued: int) -> None:
        """Say which lane is full."""
        super().__init__(
            f"the {lane} lane already has {max_queued} requests waiting",
            lane=lane,
            maximum=str(max_queued),
        )
        self.lane = lane


class QueueTimeoutError(SchedulerError):
    """A request waited longer than its lane's max wait (or its deadline) without being admitted."""

    translation_key = "queue_timeout"

    def __init__(self, *, lane: str, waited_s: float) -> None:
        """Say how long the request waited."""
        super().__init__(
            f"waited {waited_s:.1f} s in the {lane} lane without a free slot",
            lane=lane,
            waited=f"{waited_s:.1f}",
        )
        self.lane = lane


class QuotaExceededError(SchedulerError):
    """The requester spent their daily token quota and the quota action is reject."""

    translation_key = "quota_exceeded"

    def __init__(self, *, requester: str, used: int, quota: int) -> None:
        """Say who is over quota."""
        super().__init__(
            f"{requester} used {used} of {quota} tokens allowed per day",
            requester=requester,
            used=str(used),
            quota=str(quota),
        )
        self.requester = requester


class SchedulerClosedError(SchedulerError):
    """The scheduler is shutting down (integration unloaded); the request was cancelled."""

    translation_key = "scheduler_closed"

    def __init__(self) -> None:
        """Explain the shutdown."""
        super().__init__("the LLM Lanes scheduler is shutting down")


class NoServerError(SchedulerError):
    """No server of a pool can take the request now (down, asleep for an urgent lane, unable)."""

    translation_key = "no_server"

    def __init__(self, *, lane: str, reason: str) -> None:
        """Say which lane found no server, and why."""
        super().__init__(
            f"no server can serve the {lane} lane now: {reason}",
            lane=lane,
            reason=reason,
        )
        self.lane = lane
        self.reason = reason


class WakeTimeoutError(NoServerError):
    """A sleeping server was woken but did not answer its health check within the limit."""

    translation_key = "wake_timeout"

    def __init__(self, *, lane: str, server: str, limit_s: float) -> None:
        """Say which server did not wake, and how long it was given."""
        super().__init__(
            lane=lane, reason=f"{server} did not wake within {limit_s:.0f} s"
        )
        self.placeholders.update(server=server, limit=f"{limit_s:.0f}")
        self.server = server


REFUSALS: tuple[type[SchedulerError], ...] = (
    LimitExceededError,
    QueueFullError,
    QuotaExceededError,
)
"""Errors of a request refused at the door: nothing reached the server, the caller must change
the call or try later (a scheduler's record says ``rejected``)."""


# --- backends ----------------------------------------------------------------------------------


class BackendError(LanesError):
    """Talking to the LLM server failed."""

    translation_key = "server_error"


class BackendConnectionError(BackendError):
    """The server could not be reached (refused, DNS, reset before any answer)."""

    translation_key = "cannot_connect"


class BackendTimeoutError(BackendError):
    """The server did not answer in time (connect timeout, no first token, stream idle)."""

    translation_key = "server_timeout"


class FirstTokenTimeoutError(BackendTimeoutError):
    """The server accepted the request but sent no first token within the limit."""


class StreamIdleTimeoutError(BackendTimeoutError):
    """The stream went silent for longer than the idle limit."""


class BackendHTTPError(BackendError):
    """The server answered with an HTTP error status."""

    def __init__(
        self, message: str, *, status: int, body: str = "", url: str = ""
    ) -> None:
        """Keep the status and a short body excerpt (``url``: what answered it)."""
        super().__init__(message, status=str(status), url=url)
        self.status = status
        self.body = body


class ServerBusyError(BackendHTTPError):
    """The server is overloaded (Ollama 503 "server busy", 429)."""

    translation_key = "server_busy"


class ModelNotFoundError(BackendHTTPError):
    """The model is not available on the server."""

    translation_key = "model_not_found"


class AuthError(BackendHTTPError):
    """The server refused the API key."""

    translation_key = "invalid_auth"


class ToolsUnsupportedError(BackendHTTPError):
    """The server cannot take tools (llama.cpp without ``--jinja``)."""

    translation_key = "tools_unsupported"


class EmbeddingsUnsupportedError(BackendHTTPError):
    """The server computes no embeddings (llama.cpp without ``--embeddings``, a chat-only model)."""

    translation_key = "embeddings_unsupported"


class MalformedStreamError(BackendError):
    """A stream line could not be parsed."""

    translation_key = "malformed_stream"


class StreamClosedError(BackendError):
    """The server closed the stream before it said it was done."""

    translation_key = "stream_closed"


def error_text(body: str) -> str:
    """Pull the human message out of an error body (Ollama, OpenAI and llama.cpp shapes)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:_BODY_EXCERPT]
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        if error is not None:
            return str(error)[:_BODY_EXCERPT]
    return body.strip()[:_BODY_EXCERPT]


def http_error(
    status: int, body: str, *, url: str, model: str | None = None
) -> BackendHTTPError:
    """Build the typed error for an HTTP error status."""
    detail = error_text(body)
    lowered = detail.lower()
    kind: type[BackendHTTPError] = BackendHTTPError
    message = f"{url} answered HTTP {status}: {detail or 'no details'}"
    if status in (401, 403):
        kind = AuthError
        message = f"{url} refused the request (HTTP {status}): {detail or 'check the API key'}"
    elif status in (429, 503):
        kind = ServerBusyError
        message = f"{url} is busy (HTTP {status}): {detail or 'try again later'}"
    elif status == 404 and model is not None and ("model" in lowered or not detail):
        kind = ModelNotFoundError
        message = f"model {model!r} is not available at {url}: {detail or 'not found'}"
    elif status in (400, 500) and (
        "jinja" in lowered or ("tool" in lowered and "support" in lowered)
    ):
        kind = ToolsUnsupportedError
        message = f"{url} cannot use tools (start llama-server with --jinja): {detail}"
    elif status in (400, 500, 501) and "embedding" in lowered and "support" in lowered:
        kind = EmbeddingsUnsupportedError
        message = (
            f"{url} computes no embeddings (llama-server computes them when started "
            f"with --embeddings and an embedding model; on Ollama, use an embedding model): "
            f"{detail}"
        )
    return kind(message, status=status, body=detail, url=url)


# --- wire formats ------------------------------------------------------------------------------


class InvalidRequestError(LanesError):
    """A request in a wire format (OpenAI, Ollama) is malformed; ``field`` names the bad part."""

    def __init__(self, field: str, problem: str) -> None:
        """Say which field is wrong and how, e.g. ``messages[1].role: must be a string``."""
        super().__init__(f"{field}: {problem}", field=field)
        self.field = field


# --- what a finished request's error says of its server --------------------------------------


def _class_names(*errors: type[Exception]) -> frozenset[str]:
    """Name these errors and all their subclasses (a finished request names its error's class)."""
    names: set[str] = set()
    pending = list(errors)
    while pending:
        error = pending.pop()
        names.add(error.__name__)
        pending.extend(error.__subclasses__())
    return frozenset(names)


SERVER_DOWN_ERRORS: Final = _class_names(BackendConnectionError)
"""Errors of a request that say the server is down (refused, reset before any answer)."""
SERVER_SUSPECT_ERRORS: Final = _class_names(BackendTimeoutError, StreamClosedError)
"""Errors of a request that a server going down gives too (timeouts, a stream cut short): the
server is polled at once."""
