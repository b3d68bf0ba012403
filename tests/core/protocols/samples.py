"""Requests and answers the wire-format tests send through both formats."""

from __future__ import annotations

from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    TokenUsage,
    ToolCall,
    ToolSpec,
)
from custom_components.llm_lanes.core.protocols.common import StreamDecoder

WEATHER = ToolSpec(
    name="get_weather",
    description="Weather of a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
# Ollama carries no call ids: its server side numbers calls through the conversation.
CALLS = (
    ToolCall(id="call_0", name="get_weather", arguments={"city": "Paris"}),
    ToolCall(id="call_1", name="get_weather", arguments={"city": "Lyon"}),
)
QUESTION = ChatMessage(role="user", content="Weather in Paris and Lyon?")
REQUESTS = [
    ChatRequest(model="m", messages=(ChatMessage(role="user", content="hi"),)),
    ChatRequest(
        model="llama3.2",
        messages=(
            ChatMessage(role="system", content="Be brief."),
            QUESTION,
            ChatMessage(role="assistant", tool_calls=CALLS),
            ChatMessage(role="tool", content="22 C", name="get_weather"),
            ChatMessage(role="tool", content="19 C", name="get_weather"),
        ),
        tools=(WEATHER,),
        max_tokens=64,
        temperature=0.2,
        top_p=0.9,
        seed=3,
        stop=("\n\n", "User:"),
        assistant_prefix="Paris is",
        options={"num_ctx": 4096},
    ),
    ChatRequest(model="m", messages=(QUESTION,), json_schema={"type": "object"}),
    ChatRequest(model="m", messages=(QUESTION,), json_mode=True),
]
CHUNKS = [
    StreamChunk(text="It", output_tokens=1),
    StreamChunk(text=" is", output_tokens=1),
    StreamChunk(text=" sunny.", output_tokens=1),
    StreamChunk(tool_calls=CALLS),
    StreamChunk(
        done=True, finish_reason="tool_calls", usage=TokenUsage(26, 12, "server")
    ),
]


def read_back(decoder: StreamDecoder, data: bytes) -> list[StreamChunk]:
    """Feed a whole body to a client decoder line by line, as the backends do."""
    chunks: list[StreamChunk] = []
    for line in data.splitlines():
        if line.strip():
            chunks += decoder.feed(line.strip())
        if decoder.done:
            return chunks
    return [*chunks, decoder.end()]
