"""The base URLs a client is shown: the ones Home Assistant knows itself by (#21, item 7)."""

from __future__ import annotations

from homeassistant.components.http import ApiConfig
from homeassistant.core import HomeAssistant
import pytest

from custom_components.llm_lanes.gateway.clients import (
    PLACEHOLDER_URL,
    base_urls,
    home_assistant_url,
)


@pytest.mark.parametrize(
    ("internal_url", "host", "expected"),
    [
        # The internal URL the household set, whatever Home Assistant binds to.
        (
            "http://homeassistant.local:8123",
            "0.0.0.0",
            "http://homeassistant.local:8123",
        ),
        ("http://ha.lan:8123", "127.0.0.1", "http://ha.lan:8123"),
        # Bound to every address: the LAN address Home Assistant detected for itself.
        (None, "0.0.0.0", "http://192.168.1.5:8123"),
        # Bound to one address: that one (the detected address would not answer).
        (None, "127.0.0.1", "http://127.0.0.1:8123"),
        (None, "192.168.1.7", "http://192.168.1.7:8123"),
    ],
)
async def test_base_urls_follow_what_home_assistant_knows(
    hass: HomeAssistant,
    internal_url: str | None,
    host: str,
    expected: str,
) -> None:
    """The internal URL first, then where Home Assistant listens, then ``get_url``'s pick."""
    hass.config.internal_url = internal_url
    hass.config.api = ApiConfig(
        local_ip="192.168.1.5", host=host, port=8123, use_ssl=False
    )
    assert home_assistant_url(hass) == expected
    assert base_urls(hass, "k")["ollama_url"] == f"{expected}/api/llm_lanes/ollama/k"


async def test_without_a_known_url_a_placeholder_is_shown(hass: HomeAssistant) -> None:
    """No HTTP server and no URL configured: the placeholder says what to put there."""
    hass.config.api = None
    hass.config.internal_url = hass.config.external_url = None
    assert home_assistant_url(hass) == PLACEHOLDER_URL
