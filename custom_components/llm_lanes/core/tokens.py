"""Prompt-token estimate used when the caller gives no count.

About four characters per token for English text with the tokenizers of current open models, plus a
few tokens per message for the chat template. Good enough for admission (prefill budget, context
limit); the server's own count replaces it in the accounting once the answer is done.
"""

from __future__ import annotations

import json

from custom_components.llm_lanes.core.model import ChatRequest

CHARS_PER_TOKEN = 4
"""Characters of text per token, on average."""
TOKENS_PER_MESSAGE = 4
"""Chat-template overhead of one message (role markers, separators)."""


def estimate_text_tokens(text: str) -> int:
    """Estimate the tokens of one piece of text (rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_prompt_tokens(request: ChatRequest) -> int:
    """Estimate the prompt tokens of a chat request: messages, tool calls, tool schemas, prefix."""
    total = 0
    for message in request.messages:
        total += TOKENS_PER_MESSAGE + estimate_text_tokens(message.content)
        for call in message.tool_calls:
            total += estimate_text_tokens(call.name) + estimate_text_tokens(
                json.dumps(call.arguments, separators=(",", ":"))
            )
    for tool in request.tools:
        total += estimate_text_tokens(
            json.dumps(
                {"n": tool.name, "d": tool.description, "p": tool.parameters},
                separators=(",", ":"),
            )
        )
    if request.assistant_prefix:
        total += TOKENS_PER_MESSAGE + estimate_text_tokens(request.assistant_prefix)
    return max(total, 1)
