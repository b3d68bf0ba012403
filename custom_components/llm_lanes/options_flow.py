"""Options flow of an LLM Lanes server: every scheduler setting, applied live without a reload."""

from __future__ import annotations

from typing import Any

from homeassistant.config_entries import ConfigEntryState, ConfigFlowResult, OptionsFlow

from custom_components.llm_lanes.const import OPT_REQUESTER_QUOTAS
from custom_components.llm_lanes.flow_schemas import (
    async_quota_requesters,
    options_errors,
    options_schema,
    options_to_store,
)


class LLMLanesOptionsFlow(OptionsFlow):
    """Every scheduler setting; applied live, without a reload."""

    async def async_step_init(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Show the scheduler settings, lane objectives and limits in sections.

        Settings that contradict each other show an error and store nothing.
        """
        errors: dict[str, str] = {}
        if user_input is not None:
            errors = options_errors(user_input)
            try:
                options = options_to_store(self.config_entry.options, user_input)
            except ValueError:
                errors[OPT_REQUESTER_QUOTAS] = "invalid_quotas"
            if not errors:
                return self.async_create_entry(data=options)
        slots = None
        if self.config_entry.state is ConfigEntryState.LOADED:
            server = self.config_entry.runtime_data.server
            slots = server.data.info.slots if server.data is not None else None
        requesters = await async_quota_requesters(self.hass, self.config_entry)
        return self.async_show_form(
            step_id="init",
            data_schema=options_schema(
                self.config_entry.options, slots, user_input, requesters
            ),
            errors=errors,
        )
