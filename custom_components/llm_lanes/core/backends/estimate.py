"""Token estimates for servers that do not report counts (about four characters a token)."""

from __future__ import annotations

import json
import math

from .base import ChatRequest

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4
"""Role markers and separators a chat template adds around each message."""


def estimate_text_tokens(text: str) -> int:
    """Estimate the tokens of a piece of text."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


def estimate_prompt_tokens(request: ChatRequest) -> int:
    """Estimate the prompt tokens of a request: messages, tools and any assistant prefix."""
    total = 0
    for message in request.messages:
        total += MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(message.content)
        for call in message.tool_calls:
            total += estimate_text_tokens(call.name + json.dumps(call.arguments))
    for tool in request.tools:
        total += estimate_text_tokens(
            tool.name + tool.description + json.dumps(tool.parameters)
        )
    if request.assistant_prefix:
        total += MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(
            request.assistant_prefix
        )
    return total
