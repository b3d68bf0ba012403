"""Config flow for LLM Lanes: add a server, move it (reconfigure), give it a new key (reauth).

The entry's other flows live beside it: the scheduler options in ``options_flow``, the agents,
AI Task entities and gateway clients (subentries) in ``subentry_flows``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from homeassistant.config_entries import (
    ConfigEntryState,
    ConfigFlow,
    ConfigFlowResult,
    ConfigSubentryFlow,
    OptionsFlow,
)
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import callback
from homeassistant.data_entry_flow import AbortFlow
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.selector import (
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)
import probatio

from custom_components.llm_lanes.backend_setup import (
    InvalidURLError,
    ProbedServer,
    UnsupportedServerError,
    build_backend,
    normalize_url,
    probe_server,
)
from custom_components.llm_lanes.const import (
    CONF_KIND,
    CONF_MODEL,
    DOMAIN,
    LOGGER,
    SUBENTRY_AI_TASK,
    SUBENTRY_CLIENT,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.backends.kinds import ServerKind, server_profile
from custom_components.llm_lanes.core.errors import AuthError, BackendError
from custom_components.llm_lanes.core.slot_context import is_small
from custom_components.llm_lanes.entry_defaults import (
    NAMED_SUBENTRY_TYPES,
    default_names,
    default_subentries,
    entry_title,
    other_server_urls,
    server_name,
    subentry_name,
)
from custom_components.llm_lanes.options_flow import LLMLanesOptionsFlow
from custom_components.llm_lanes.repairs import small_context_placeholders
from custom_components.llm_lanes.subentry_flows import (
    LLMLanesClientFlow,
    LLMLanesSubentryFlow,
)

STEP_USER_SCHEMA = probatio.Schema(
    {
        probatio.Required(CONF_URL): TextSelector(
            TextSelectorConfig(type=TextSelectorType.URL)
        ),
        probatio.Optional(CONF_API_KEY): TextSelector(
            TextSelectorConfig(type=TextSelectorType.PASSWORD)
        ),
    }
)

STEP_REAUTH_SCHEMA = probatio.Schema(
    {
        probatio.Required(CONF_API_KEY): TextSelector(
            TextSelectorConfig(type=TextSelectorType.PASSWORD)
        ),
    }
)


def model_selector(models: tuple[str, ...]) -> SelectSelector:
    """Build a drop-down of the models a server offers."""
    return SelectSelector(
        SelectSelectorConfig(
            options=[SelectOptionDict(value=model, label=model) for model in models],
            mode=SelectSelectorMode.DROPDOWN,
            sort=True,
        )
    )


URL_EXAMPLE: Final = {"example_url": "http://192.168.1.20:11434"}
"""The example the URL field's description shows (strings carry no URL: hassfest's rule)."""


class LLMLanesConfigFlow(ConfigFlow, domain=DOMAIN):
    """Add an LLM server: URL (and API key), detection, then the model to serve."""

    VERSION = 1
    MINOR_VERSION = 2
    """1.2: agents and AI Task entities are named after their server alone (``entry_defaults``)."""

    def __init__(self) -> None:
        """Start with nothing probed."""
        self._url = ""
        self._api_key: str | None = None
        self._probed: ProbedServer | None = None
        self._entry_data: dict[str, Any] = {}

    async def _async_probe(
        self, user_input: dict[str, Any]
    ) -> tuple[ProbedServer | None, dict[str, str]]:
        """Check that the URL points at a supported server that answers and serves models."""
        try:
            self._url = normalize_url(user_input[CONF_URL])
        except InvalidURLError:
            return None, {CONF_URL: "invalid_url"}
        self._api_key = (user_input.get(CONF_API_KEY) or "").strip() or None
        try:
            probed = await probe_server(
                async_get_clientsession(self.hass), self._url, self._api_key
            )
        except AuthError:
            return None, {"base": "invalid_auth"}
        except UnsupportedServerError:
            return None, {"base": "unsupported_server"}
        except BackendError as err:
            LOGGER.debug("Cannot reach %s: %s", self._url, err)
            return None, {"base": "cannot_connect"}
        if not probed.info.models:
            return None, {"base": "no_models"}
        return probed, {}

    @callback
    def _abort_if_url_configured(self, entry_id: str | None = None) -> None:
        """Abort when another entry has this URL, as the flow writes it now.

        Entries stored before the flow wrote URLs without ``/v1`` have it in their URL and
        unique id: the server is the same.
        """
        for other in self._async_current_entries(include_ignore=False):
            if other.entry_id == entry_id or CONF_URL not in other.data:
                continue
            try:
                stored = normalize_url(other.data[CONF_URL])
            except InvalidURLError:
                continue
            if stored == self._url:
                raise AbortFlow("already_configured")

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask for the server URL and API key."""
        errors: dict[str, str] = {}
        if user_input is not None:
            probed, errors = await self._async_probe(user_input)
            if probed is not None:
                await self.async_set_unique_id(probed.info.unique_id)
                self._abort_if_unique_id_configured()
                self._abort_if_url_configured()
                self._probed = probed
                return await self.async_step_model()
        return self.async_show_form(
            step_id="user",
            data_schema=self.add_suggested_values_to_schema(
                STEP_USER_SCHEMA, user_input
            ),
            errors=errors,
            description_placeholders={CONF_URL: self._url, **URL_EXAMPLE},
        )

    async def async_step_model(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Pick the model the server serves to Home Assistant."""
        assert self._probed is not None
        info = self._probed.info
        if user_input is not None:
            model = user_input[CONF_MODEL]
            data: dict[str, Any] = {
                CONF_URL: self._url,
                CONF_KIND: self._probed.kind.value,
                CONF_MODEL: model,
            }
            if self._api_key:
                data[CONF_API_KEY] = self._api_key
            self._entry_data = data
            if is_small(info.context_length):
                return await self.async_step_small_context()
            return self._async_create_server_entry()
        default = info.loaded_models[0] if info.loaded_models else info.models[0]
        return self.async_show_form(
            step_id="model",
            data_schema=probatio.Schema(
                {
                    probatio.Required(CONF_MODEL, default=default): model_selector(
                        info.models
                    )
                }
            ),
            description_placeholders={
                "kind": server_profile(self._probed.kind).name,
                "version": info.version or "?",
            },
        )

    async def async_step_small_context(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Say that the server's slots are too small for Assist before adding it anyway.

        The entry's repair then says what to change for this kind of server.
        """
        assert self._probed is not None
        if user_input is not None:
            return self._async_create_server_entry()
        info = self._probed.info
        return self.async_show_form(
            step_id="small_context",
            description_placeholders=small_context_placeholders(
                entry_title(self._server_name(), self._entry_data[CONF_MODEL]),
                info.context_length or 0,
                info.slots,
            ),
        )

    def _server_name(self) -> str:
        """Return the probed server's default name (its kind and host)."""
        assert self._probed is not None
        return server_name(self._probed.kind, self._url, other_server_urls(self.hass))

    @callback
    def _async_create_server_entry(self) -> ConfigFlowResult:
        """Create the entry of the probed server with the model chosen."""
        model = self._entry_data[CONF_MODEL]
        name = self._server_name()
        return self.async_create_entry(
            title=entry_title(name, model),
            data=self._entry_data,
            subentries=default_subentries(name, model),
        )

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Change the URL or API key: the same server, or the same kind of server moved elsewhere.

        A server that moved keeps its entry (agents, sensors, history): the new address must lead
        to a server of the same kind that no other entry has. Titles that are the defaults of the
        old address follow the new one.
        """
        entry = self._get_reconfigure_entry()
        kind = ServerKind(entry.data[CONF_KIND])
        errors: dict[str, str] = {}
        placeholders = {
            CONF_URL: entry.data[CONF_URL],
            "kind": server_profile(kind).name,
            "found": "",
            **URL_EXAMPLE,
        }
        if user_input is not None:
            probed, errors = await self._async_probe(user_input)
            placeholders[CONF_URL] = self._url or user_input[CONF_URL]
            if probed is not None and probed.kind is not kind:
                errors = {"base": "wrong_server_kind"}
                placeholders["found"] = server_profile(probed.kind).name
            elif probed is not None:
                await self.async_set_unique_id(probed.info.unique_id)
                if probed.info.unique_id != entry.unique_id:
                    self._abort_if_unique_id_configured()
                self._abort_if_url_configured(entry.entry_id)
                data = {**entry.data, CONF_URL: self._url}
                data.pop(CONF_API_KEY, None)
                if self._api_key:
                    data[CONF_API_KEY] = self._api_key
                self._async_rename_defaults(entry, self._url)
                return self._async_store(
                    entry,
                    unique_id=probed.info.unique_id,
                    title=self._moved_title(entry, self._url),
                    data=data,
                )
        return self.async_show_form(
            step_id="reconfigure",
            data_schema=self.add_suggested_values_to_schema(
                STEP_USER_SCHEMA, user_input or {CONF_URL: entry.data[CONF_URL]}
            ),
            errors=errors,
            description_placeholders=placeholders,
        )

    def _moved_title(self, entry: LLMLanesConfigEntry, url: str) -> str:
        """Return the entry's title at ``url``: the new default in place of the old, or its own."""
        kind = ServerKind(entry.data[CONF_KIND])
        model = entry.data[CONF_MODEL]
        old = default_names(kind, entry.data[CONF_URL])
        if entry.title not in {entry_title(name, model) for name in old}:
            return entry.title
        return entry_title(
            server_name(kind, url, other_server_urls(self.hass, entry.entry_id)), model
        )

    @callback
    def _async_rename_defaults(self, entry: LLMLanesConfigEntry, url: str) -> None:
        """Give the agents and AI Task entities named after the old address the new name."""
        kind = ServerKind(entry.data[CONF_KIND])
        old = default_names(kind, entry.data[CONF_URL])
        new = server_name(kind, url, other_server_urls(self.hass, entry.entry_id))
        for subentry in entry.subentries.values():
            if subentry.subentry_type not in NAMED_SUBENTRY_TYPES:
                continue
            if subentry.title in {
                subentry_name(subentry.subentry_type, name) for name in old
            }:
                self.hass.config_entries.async_update_subentry(
                    entry, subentry, title=subentry_name(subentry.subentry_type, new)
                )

    @callback
    def _async_store(
        self,
        entry: LLMLanesConfigEntry,
        *,
        data: Mapping[str, Any],
        unique_id: str | None = None,
        title: str | None = None,
    ) -> ConfigFlowResult:
        """Store the entry's new data and finish; the entry then reloads with it.

        A loaded entry follows its own changes: its update listener reloads it (Home Assistant
        wants an entry that has one to reload from it). One that is not loaded (its set-up
        failed, or waits for a retry) has no listener: this flow sets it up again.
        """
        changes: dict[str, Any] = {"data": data}
        if unique_id is not None:
            changes["unique_id"] = unique_id
        if title is not None:
            changes["title"] = title
        if entry.state is ConfigEntryState.LOADED:
            return self.async_update_and_abort(entry, **changes)
        return self.async_update_reload_and_abort(entry, **changes)

    async def async_step_reauth(
        self, entry_data: Mapping[str, Any]
    ) -> ConfigFlowResult:
        """Ask for a new API key: the server refused the stored one."""
        return await self.async_step_reauth_confirm()

    async def async_step_reauth_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask for the new API key and check it against the server."""
        entry = self._get_reauth_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            api_key = user_input[CONF_API_KEY].strip()
            backend = build_backend(
                async_get_clientsession(self.hass),
                ServerKind(entry.data[CONF_KIND]),
                entry.data[CONF_URL],
                api_key or None,
            )
            try:
                await backend.server_info()
            except AuthError:
                errors["base"] = "invalid_auth"
            except BackendError as err:
                LOGGER.debug("Cannot reach %s: %s", entry.data[CONF_URL], err)
                errors["base"] = "cannot_connect"
            else:
                # An empty key that works: the server no longer asks for one.
                data = {
                    key: value
                    for key, value in entry.data.items()
                    if key != CONF_API_KEY
                }
                if api_key:
                    data[CONF_API_KEY] = api_key
                return self._async_store(entry, data=data)
        return self.async_show_form(
            step_id="reauth_confirm",
            data_schema=STEP_REAUTH_SCHEMA,
            description_placeholders={
                "name": entry.title,
                CONF_URL: entry.data[CONF_URL],
            },
            errors=errors,
        )

    @staticmethod
    @callback
    def async_get_options_flow(config_entry: LLMLanesConfigEntry) -> OptionsFlow:
        """Edit the scheduler settings."""
        return LLMLanesOptionsFlow()

    @classmethod
    @callback
    def async_get_supported_subentry_types(
        cls, config_entry: LLMLanesConfigEntry
    ) -> dict[str, type[ConfigSubentryFlow]]:
        """Conversation agents, AI Task entities and gateway clients, any number of each."""
        return {
            SUBENTRY_CONVERSATION: LLMLanesSubentryFlow,
            SUBENTRY_AI_TASK: LLMLanesSubentryFlow,
            SUBENTRY_CLIENT: LLMLanesClientFlow,
        }
