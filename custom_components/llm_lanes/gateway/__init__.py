"""The household gateway: OpenAI- and Ollama-compatible endpoints served by Home Assistant.

Every other LLM client of the home (Open WebUI, scripts, phone apps, Home Assistant's own
``ollama`` and ``llama_cpp`` integrations) reaches the server through the same scheduler as our
own agents: each client (a ``client`` subentry of a server entry) has a key, a lane and a
requester. ``openai_api`` and ``ollama_api`` hold the views, ``auth`` who is calling,
``clients`` the client subentries, ``serving`` which server answers and what a request becomes,
``relay`` the HTTP side of a stream, ``in_flight`` the requests being answered (which Home
Assistant's stop ends), ``http_errors`` the statuses.
"""

from __future__ import annotations

from homeassistant.core import HomeAssistant, callback

from custom_components.llm_lanes.gateway.in_flight import async_track_in_flight
from custom_components.llm_lanes.gateway.ollama_api import OllamaView
from custom_components.llm_lanes.gateway.openai_api import OpenAIView


@callback
def async_register_gateway(hass: HomeAssistant) -> None:
    """Serve both endpoints from Home Assistant's HTTP server (once, for every server entry).

    Their requests in flight are counted, so that Home Assistant's stop ends them.
    """
    async_track_in_flight(hass)
    hass.http.register_view(OpenAIView())
    hass.http.register_view(OllamaView())
