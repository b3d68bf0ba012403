"""The prompt-token estimate."""

from __future__ import annotations

from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest, ToolSpec
from custom_components.llm_lanes.core.tokens import (
    estimate_prompt_tokens,
    estimate_text_tokens,
)


def test_estimate_counts_messages_tools_and_prefix() -> None:
    """About four characters per token, plus per-message overhead, tools and the prefix."""
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("abcde") == 2
    base = ChatRequest(
        model="m", messages=(ChatMessage(role="user", content="x" * 400),)
    )
    assert estimate_prompt_tokens(base) == 104
    with_tool = ChatRequest(
        model="m",
        messages=base.messages,
        tools=(
            ToolSpec(
                name="light", description="turn on", parameters={"type": "object"}
            ),
        ),
        assistant_prefix="y" * 40,
    )
    assert estimate_prompt_tokens(with_tool) > 104 + 4 + 10
