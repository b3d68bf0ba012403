"""Constants of the LLM Lanes integration."""

from __future__ import annotations

import logging
from typing import Final

DOMAIN: Final = "llm_lanes"
LOGGER = logging.getLogger(__package__)

CONF_MODEL: Final = "model"

# Option keys shared by the options flow and the control entities (number/switch/select). Changing
# one of them through ``hass.config_entries.async_update_entry(entry, options=...)`` re-applies the
# scheduler settings live, without reloading the entry.
OPT_POLICY: Final = "policy"
OPT_MAX_SEQUENCES: Final = "max_sequences"
OPT_BACKGROUND_SHARE: Final = "background_share"
OPT_BACKGROUND_PAUSED: Final = "background_paused"

EVENT_REQUEST_FINISHED: Final = "llm_lanes_request_finished"
