"""AI Task entities of a server: structured or free-text generation in the automation lane."""

from __future__ import annotations

import json
from typing import Any

from homeassistant.components import ai_task, conversation
from homeassistant.helpers import llm
import probatio

from custom_components.llm_lanes.const import SUBENTRY_AI_TASK
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.entity import (
    LLMLanesSubentryEntity,
    subentry_platform_setup,
)
from custom_components.llm_lanes.error_translation import failure
from custom_components.llm_lanes.requesters import (
    AI_TASK_REQUESTER,
    requester_for_context,
)

PARALLEL_UPDATES = 0


class LLMLanesTaskEntity(ai_task.AITaskEntity, LLMLanesSubentryEntity):
    """Generates data for automations through the server's scheduler."""

    _attr_supported_features = ai_task.AITaskEntityFeature.GENERATE_DATA
    name_key = "ai_task"

    async def _async_generate_data(
        self,
        task: ai_task.GenDataTask,
        chat_log: conversation.ChatLog,
    ) -> ai_task.GenDataTaskResult:
        """Answer the task; with a structure, ask the server for JSON that matches it."""
        json_schema: dict[str, Any] | None = None
        if task.structure is not None:
            json_schema = probatio.to_openapi(
                task.structure,
                custom_serializer=(
                    chat_log.llm_api.custom_serializer
                    if chat_log.llm_api
                    else llm.selector_serializer
                ),
                openapi_version="3.1.0",
            )
        await self._async_answer(
            chat_log,
            lane=Lane.AUTOMATION,
            requester=requester_for_context(
                self.hass, self._context, AI_TASK_REQUESTER
            ),
            json_schema=json_schema,
        )
        last = chat_log.content[-1]
        text = last.content if isinstance(last, conversation.AssistantContent) else None
        if text is None:
            raise failure("empty_answer")
        if task.structure is None:
            return ai_task.GenDataTaskResult(
                conversation_id=chat_log.conversation_id, data=text
            )
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise failure("invalid_structured_answer") from err
        return ai_task.GenDataTaskResult(
            conversation_id=chat_log.conversation_id, data=data
        )


async_setup_entry = subentry_platform_setup(SUBENTRY_AI_TASK, LLMLanesTaskEntity)
"""Add one AI Task entity per AI Task subentry."""
