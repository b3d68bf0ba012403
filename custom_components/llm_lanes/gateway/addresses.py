"""What a gateway client reads of an error: each LLM server by its name, never its address.

An engine error names the URL it failed at (``cannot connect to http://10.0.0.5:8080/v1/...``)
for the admin's log and repairs. A key holder is told which server by its entry's title, and
what to do; where the household's servers are stays in Home Assistant. Every error the gateway
answers or ends a stream with goes through ``hide_addresses``: each server's base URL (and any
path after it), its ``host:port`` and asyncio's ``('host', port)`` become the server's name.
"""

from __future__ import annotations

from collections.abc import Iterator
from http import HTTPStatus
import logging
import re

from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
from yarl import URL

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.backends.transport import normalize_base_url
from custom_components.llm_lanes.gateway.http_errors import GatewayError

_LOGGER = logging.getLogger(__name__)

_PATH = r"(?:/[\w\-.~%/?=&+]*[\w/])?"
"""What may follow an address in a message: a path (a sentence's full stop is not part of it)."""


def _addresses(url: str) -> Iterator[str]:
    """Return the patterns of a server's address: its URL with a path, host:port, (host, port)."""
    base = normalize_base_url(url)
    yield re.escape(base) + _PATH
    parsed = URL(base)
    if parsed.host is None or parsed.port is None:
        return
    host = re.escape(parsed.host)
    yield rf"\b{host}:{parsed.port}\b{_PATH}"
    yield rf"\(\s*'{host}',\s*{parsed.port}\s*\)"


def hide_addresses(hass: HomeAssistant, text: str) -> str:
    """Return ``text`` with every LLM server's address replaced by its name."""
    for entry in hass.config_entries.async_entries(DOMAIN):
        url = entry.data.get(CONF_URL)
        if not isinstance(url, str) or not url:
            continue
        # A replacement string reads backslashes as escapes: a title's own are doubled.
        name = f"the LLM server {entry.title!r}".replace("\\", "\\\\")
        for pattern in _addresses(url):
            text = re.sub(pattern, name, text)
    return text


def for_client(hass: HomeAssistant, err: GatewayError) -> GatewayError:
    """Return ``err`` as its client may read it; the admin's log keeps what it said.

    A server's failure is logged at WARNING (a server that does not answer is said once by
    its poll, so its 503s only at DEBUG), the server's refusal of a client's request at DEBUG.
    """
    hidden = hide_addresses(hass, err.message)
    if hidden != err.message:
        failed = err.status >= 500 and err.status != HTTPStatus.SERVICE_UNAVAILABLE
        _LOGGER.log(
            logging.WARNING if failed else logging.DEBUG,
            "A gateway request failed with HTTP %s: %s",
            int(err.status),
            err.message,
        )
        err.message = hidden
    return err
