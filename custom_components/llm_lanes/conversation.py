"""The Assist agents of a server: voice requests in the voice lane, typed chats interactive."""

from __future__ import annotations

from typing import Literal

from homeassistant.components import conversation
from homeassistant.components.conversation.models import AbstractConversationAgent
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import MATCH_ALL
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import intent

from custom_components.llm_lanes.const import (
    CONF_LLM_HASS_API,
    CONF_PROMPT,
    DOMAIN,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.coordinator import LLMLanesConfigEntry
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.entity import (
    LLMLanesSubentryEntity,
    subentry_platform_setup,
)
from custom_components.llm_lanes.household import household_of
from custom_components.llm_lanes.requesters import device_requester, user_requester

PARALLEL_UPDATES = 0


def lane_for_input(user_input: conversation.ConversationInput) -> Lane:
    """Voice satellites and voice pipelines go first; typed chats are interactive."""
    if user_input.device_id or user_input.satellite_id:
        return Lane.VOICE
    return Lane.INTERACTIVE


def requester_for_input(user_input: conversation.ConversationInput) -> str:
    """Charge the user, else the satellite (device) that heard the command."""
    if user_input.context.user_id:
        return user_requester(user_input.context.user_id)
    if device := user_input.device_id or user_input.satellite_id:
        return device_requester(device)
    return "conversation"


class LLMLanesConversationEntity(
    conversation.ConversationEntity,
    AbstractConversationAgent,
    LLMLanesSubentryEntity,
):
    """An Assist agent backed by the server's scheduler."""

    _attr_supports_streaming = True
    name_key = "conversation"

    def __init__(self, entry: LLMLanesConfigEntry, subentry: ConfigSubentry) -> None:
        """Offer home control when the agent has an LLM API."""
        super().__init__(entry, subentry)
        if subentry.data.get(CONF_LLM_HASS_API):
            self._attr_supported_features = (
                conversation.ConversationEntityFeature.CONTROL
            )

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        """Any language the model speaks."""
        return MATCH_ALL

    async def async_added_to_hass(self) -> None:
        """Register as an agent."""
        await super().async_added_to_hass()
        conversation.async_set_agent(self.hass, self.entry, self)

    async def async_will_remove_from_hass(self) -> None:
        """Unregister the agent."""
        conversation.async_unset_agent(self.hass, self.entry)
        await super().async_will_remove_from_hass()

    async def async_prepare(self, language: str | None = None) -> None:
        """Make room for a command that is coming (the Assist pipeline began speech-to-text).

        The scheduler holds back long background prompts and the background streams beyond the
        learned limit for a few seconds, and a server that unloaded the model reloads it now.
        An agent of the pool prepares the server the command will go to, and starts waking the
        sleeping servers voice prefers to it, for the follow-up.
        """
        if self.uses_pool:
            await household_of(self.hass).async_prepare()
            return
        runtime = self.entry.runtime_data
        runtime.scheduler.prepare(Lane.VOICE)
        await runtime.server.async_ensure_model_loaded()

    async def _async_handle_message(
        self,
        user_input: conversation.ConversationInput,
        chat_log: conversation.ChatLog,
    ) -> conversation.ConversationResult:
        """Answer one turn, through the voice or interactive lane."""
        settings = self.settings
        try:
            await chat_log.async_provide_llm_data(
                user_input.as_llm_context(DOMAIN),
                settings.get(CONF_LLM_HASS_API),
                settings.get(CONF_PROMPT),
                user_input.extra_system_prompt,
            )
        except conversation.ConverseError as err:
            return err.as_conversation_result()
        try:
            await self._async_answer(
                chat_log,
                lane=lane_for_input(user_input),
                requester=requester_for_input(user_input),
            )
        except HomeAssistantError as err:
            response = intent.IntentResponse(language=user_input.language)
            response.async_set_error(intent.IntentResponseErrorCode.UNKNOWN, str(err))
            return conversation.ConversationResult(
                response=response,
                conversation_id=chat_log.conversation_id,
                continue_conversation=False,
            )
        return conversation.async_get_result_from_chat_log(user_input, chat_log)


async_setup_entry = subentry_platform_setup(
    SUBENTRY_CONVERSATION, LLMLanesConversationEntity
)
"""Add one agent per conversation subentry."""
