"""Subentry flows of an LLM Lanes server: its Assist agents, AI Task entities and gateway clients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.config_entries import (
    SOURCE_RECONFIGURE,
    ConfigEntryState,
    ConfigSubentryFlow,
    SubentryFlowResult,
)
from homeassistant.const import CONF_API_KEY, CONF_NAME, CONF_URL
import probatio

from custom_components.llm_lanes.const import CONF_KIND, CONF_MODEL, CONF_ROTATE_KEY
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.entry_defaults import (
    other_server_urls,
    server_name,
    subentry_name,
)
from custom_components.llm_lanes.flow_schemas import (
    client_data,
    client_schema,
    subentry_schema,
)
from custom_components.llm_lanes.gateway.clients import base_urls, new_api_key


class LLMLanesSubentryFlow(ConfigSubentryFlow):
    """Add or change a conversation agent or an AI Task entity of a server."""

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Add an agent or AI Task entity."""
        return await self._async_step_set_options(user_input, None)

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Change an agent or AI Task entity."""
        return await self._async_step_set_options(
            user_input, self._get_reconfigure_subentry().data
        )

    async def _async_step_set_options(
        self,
        user_input: dict[str, Any] | None,
        current: Mapping[str, Any] | None,
    ) -> SubentryFlowResult:
        entry = self._get_entry()
        if entry.state is not ConfigEntryState.LOADED:
            return self.async_abort(reason="entry_not_loaded")
        if user_input is not None:
            data = {key: value for key, value in user_input.items() if key != CONF_NAME}
            if current is None:
                return self.async_create_entry(title=user_input[CONF_NAME], data=data)
            return self.async_update_and_abort(
                entry, self._get_reconfigure_subentry(), data=data
            )
        server = entry.runtime_data.server
        models = server.data.info.models if server.data is not None else ()
        name = server_name(
            ServerKind(entry.data[CONF_KIND]),
            entry.data[CONF_URL],
            other_server_urls(self.hass, entry.entry_id),
        )
        return self.async_show_form(
            step_id="user" if current is None else "reconfigure",
            data_schema=subentry_schema(
                self.hass,
                subentry_type=self._subentry_type,
                models=models or (entry.data[CONF_MODEL],),
                current=current,
                default_model=entry.data[CONF_MODEL],
                default_name=subentry_name(self._subentry_type, name),
            ),
        )


class LLMLanesClientFlow(ConfigSubentryFlow):
    """Add or change a gateway client: its lane and limits, and its key (shown once)."""

    def __init__(self) -> None:
        """Start with nothing chosen."""
        self._title = ""
        self._data: dict[str, Any] = {}

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Name the client and choose its lane and limits; a key is made for it."""
        if user_input is not None:
            self._title = user_input[CONF_NAME]
            self._data = {**client_data(user_input), CONF_API_KEY: new_api_key()}
            return await self.async_step_key()
        return self.async_show_form(step_id="user", data_schema=client_schema(None))

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Change the client's lane and limits; rotate its key if asked."""
        subentry = self._get_reconfigure_subentry()
        if user_input is not None:
            self._data = {
                **client_data(user_input),
                CONF_API_KEY: subentry.data[CONF_API_KEY],
            }
            if user_input.get(CONF_ROTATE_KEY):
                self._data[CONF_API_KEY] = new_api_key()
                return await self.async_step_key()
            return self.async_update_and_abort(
                self._get_entry(), subentry, data=self._data
            )
        return self.async_show_form(
            step_id="reconfigure", data_schema=client_schema(subentry.data)
        )

    async def async_step_key(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Show the key, once, with the two base URLs; the key is kept when this step is done."""
        if user_input is not None:
            if self.source == SOURCE_RECONFIGURE:
                return self.async_update_and_abort(
                    self._get_entry(), self._get_reconfigure_subentry(), data=self._data
                )
            return self.async_create_entry(title=self._title, data=self._data)
        api_key = self._data[CONF_API_KEY]
        return self.async_show_form(
            step_id="key",
            data_schema=probatio.Schema({}),
            description_placeholders={
                "api_key": api_key,
                **base_urls(self.hass, api_key),
            },
        )
