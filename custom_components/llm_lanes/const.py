"""Constants of the LLM Lanes integration."""

from __future__ import annotations

import logging
from typing import Final

DOMAIN: Final = "llm_lanes"
LOGGER = logging.getLogger(__package__)

CONF_MODEL: Final = "model"
