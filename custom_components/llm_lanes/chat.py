"""Runs a Home Assistant chat log through the scheduler: the shared part of the LLM entities."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
import contextlib
import json
from typing import Any

from homeassistant.components import conversation
from homeassistant.helpers import llm
import probatio

from custom_components.llm_lanes.const import CONF_MODEL, CONF_TEMPERATURE
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    ToolCall,
    ToolSpec,
)
from custom_components.llm_lanes.core.pool import ServerPool
from custom_components.llm_lanes.core.router import ANY_MODEL
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens
from custom_components.llm_lanes.error_translation import (
    refuse_unless_fits,
    translated_errors,
)

MAX_TOOL_ITERATIONS = 10
"""Rounds of tool calls one turn may take before we stop asking the model."""


def tool_spec(tool: llm.Tool, llm_api: llm.APIInstance) -> ToolSpec:
    """Describe a Home Assistant LLM tool to the model (JSON schema parameters)."""
    return ToolSpec(
        name=tool.name,
        description=tool.description or "",
        parameters=probatio.to_openapi(
            tool.parameters,
            custom_serializer=llm_api.custom_serializer,
            openapi_version="3.1.0",
        ),
    )


def chat_message(content: conversation.Content) -> ChatMessage:
    """Convert one chat log entry into a backend message."""
    if isinstance(content, conversation.ToolResultContent):
        return ChatMessage(
            role="tool",
            content=json.dumps(content.result.data),
            tool_call_id=content.tool_call_id,
            name=content.tool_name,
        )
    if isinstance(content, conversation.AssistantContent):
        return ChatMessage(
            role="assistant",
            content=content.content or "",
            tool_calls=tuple(
                ToolCall(id=call.id, name=call.tool_name, arguments=call.tool_args)
                for call in content.tool_calls or ()
            ),
        )
    if isinstance(content, conversation.UserContent):
        return ChatMessage(role="user", content=content.content)
    return ChatMessage(role="system", content=content.content)


async def _deltas(
    chunks: AsyncIterator[StreamChunk],
) -> AsyncGenerator[conversation.AssistantContentDeltaDict]:
    """Turn scheduler chunks into chat log deltas (one assistant message per request)."""
    yield {"role": "assistant"}
    async for chunk in chunks:
        delta: conversation.AssistantContentDeltaDict = {}
        if chunk.text:
            delta["content"] = chunk.text
        if chunk.tool_calls:
            delta["tool_calls"] = [
                llm.ToolInput(id=call.id, tool_name=call.name, tool_args=call.arguments)
                for call in chunk.tool_calls
            ]
        if delta:
            yield delta


def _refuse_unless_fits(
    scheduler: Scheduler, request: ChatRequest, lane: Lane, context: int | None
) -> None:
    """Refuse a turn the server's slot cannot hold beside its default answer (translated)."""
    prompt = estimate_prompt_tokens(request)
    output = scheduler.settings.lanes[lane].default_output_tokens
    refuse_unless_fits("prompt_exceeds_slot", prompt, output, context)


async def async_run_chat_log(
    target: Scheduler | ServerPool,
    chat_log: conversation.ChatLog,
    *,
    agent_id: str,
    settings: dict[str, Any],
    lane: Lane,
    requester: str,
    json_schema: dict[str, Any] | None = None,
    context_per_slot: int | None = None,
) -> None:
    """Answer the chat log through the scheduler, calling tools until the model is done.

    Raises ``HomeAssistantError`` (translated) when the scheduler or the server fails. A turn
    whose prompt and default answer cannot fit ``context_per_slot`` (what one request may hold at
    the server) is refused before anything is sent, with the numbers and what to change: it is
    not trimmed, because most of it is Assist's own prompt (the exposed entities, the tools), and
    an agent that cannot see them would act on part of the home without saying so.

    Through the household's pool (``target`` a ``ServerPool``) the request names no model: each
    server runs it as its own; a server whose slot cannot hold the turn is passed over, and the
    pool refuses it (translated) when no server can take it.
    """
    tools: tuple[ToolSpec, ...] = ()
    if chat_log.llm_api is not None:
        tools = tuple(
            tool_spec(tool, chat_log.llm_api) for tool in chat_log.llm_api.tools
        )
    temperature = settings.get(CONF_TEMPERATURE)
    pooled = isinstance(target, ServerPool)
    for _iteration in range(MAX_TOOL_ITERATIONS):
        request = ChatRequest(
            model=ANY_MODEL if pooled else settings[CONF_MODEL],
            messages=tuple(chat_message(content) for content in chat_log.content),
            tools=tools,
            temperature=float(temperature) if temperature is not None else None,
            json_schema=json_schema,
        )
        if not isinstance(target, ServerPool):
            _refuse_unless_fits(target, request, lane, context_per_slot)
        # Closing the stream when the chat log stops early frees the slot at once.
        with translated_errors():
            async with contextlib.aclosing(
                target.stream(request, lane=lane, requester=requester)
            ) as stream:
                async for _content in chat_log.async_add_delta_content_stream(
                    agent_id, _deltas(stream)
                ):
                    pass
        if not chat_log.unresponded_tool_results:
            break
