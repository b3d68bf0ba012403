"""Subentry flows of an LLM Lanes server: its Assist agents, AI Task entities and gateway clients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.config_entries import (
    ConfigEntryState,
    ConfigSubentryFlow,
    SubentryFlowResult,
)
from homeassistant.const import CONF_API_KEY, CONF_NAME, CONF_URL

from custom_components.llm_lanes.const import CONF_KIND, CONF_MODEL, CONF_ROTATE_KEY
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.entry_defaults import (
    other_server_urls,
    server_name,
    subentry_name,
)
from custom_components.llm_lanes.gateway.clients import key_placeholders, new_api_key
from custom_components.llm_lanes.subentry_schemas import (
    client_data,
    client_schema,
    subentry_schema,
)


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
    """Add or change a gateway client: its lane and limits, and its key (shown once).

    The client is stored as soon as its form is submitted, and its key is shown in the result
    (the *Created* dialog of a new client, the closing message of a key made anew), with the base
    URLs Home Assistant is reached at: closing that dialog, with its X or not, loses nothing but
    the chance to copy the key (*Reconfigure* makes a new one).
    """

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Name the client and choose its lane and limits; it is added with a new key."""
        if user_input is not None:
            api_key = new_api_key()
            return self.async_create_entry(
                title=user_input[CONF_NAME],
                data={**client_data(user_input), CONF_API_KEY: api_key},
                description="key",
                description_placeholders=key_placeholders(self.hass, api_key),
            )
        return self.async_show_form(step_id="user", data_schema=client_schema(None))

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Change the client's lane and limits; make it a new key if asked (shown once)."""
        entry = self._get_entry()
        subentry = self._get_reconfigure_subentry()
        if user_input is None:
            return self.async_show_form(
                step_id="reconfigure", data_schema=client_schema(subentry.data)
            )
        data = {**client_data(user_input), CONF_API_KEY: subentry.data[CONF_API_KEY]}
        if not user_input.get(CONF_ROTATE_KEY):
            return self.async_update_and_abort(entry, subentry, data=data)
        data[CONF_API_KEY] = new_api_key()
        self.hass.config_entries.async_update_subentry(entry, subentry, data=data)
        return self.async_abort(
            reason="key_rotated",
            description_placeholders=key_placeholders(self.hass, data[CONF_API_KEY]),
        )
