"""Config flow for LLM Lanes."""

from __future__ import annotations

from typing import Any

from homeassistant.config_entries import ConfigFlow, ConfigFlowResult
from homeassistant.const import CONF_URL
import probatio

from .const import DOMAIN


class LLMLanesConfigFlow(ConfigFlow, domain=DOMAIN):
    """Add an LLM server."""

    VERSION = 1

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask for the server URL."""
        if user_input is not None:
            self._async_abort_entries_match({CONF_URL: user_input[CONF_URL]})
            return self.async_create_entry(title=user_input[CONF_URL], data=user_input)
        return self.async_show_form(
            step_id="user",
            data_schema=probatio.Schema({probatio.Required(CONF_URL): str}),
        )
