"""What the gateway tests send: messages, a tool, a schema, and a long answer that holds its slot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import openai
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk

from tests.support.entries import MODEL

HELLO: list[Any] = [{"role": "user", "content": "Hello"}]
TURN_ON: list[Any] = [{"role": "user", "content": 'HassTurnOn name="Kitchen light"'}]
"""Asks the simulated model to call ``HassTurnOn`` (see ``tools.simulator.answers``)."""
LIGHTS: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "HassTurnOn",
        "description": "Turn on a device",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
}
ROOM: dict[str, Any] = {
    "type": "object",
    "properties": {"room": {"type": "string", "enum": ["kitchen", "hall"]}},
    "required": ["room"],
}


async def long_stream(
    api: openai.AsyncOpenAI, model: str = MODEL, max_tokens: int = 2000
) -> AsyncStream[ChatCompletionChunk]:
    """Start a streamed answer of ``max_tokens`` tokens (``ignore_eos``: it never stops early)."""
    return await api.chat.completions.create(
        model=model,
        messages=HELLO,
        stream=True,
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},
    )


def delta_texts(events: Sequence[ChatCompletionChunk]) -> list[str]:
    """Return the text of each event of a streamed chat that carries some."""
    return [
        text
        for event in events
        if event.choices and (text := event.choices[0].delta.content)
    ]


async def stream_lines(
    response: aiohttp.ClientResponse, *, events: bool
) -> AsyncIterator[bytes]:
    """Read a streamed answer line by line, blank lines left out.

    With ``events`` (the OpenAI endpoint's server-sent events) only the ``data:`` lines, their
    prefix removed (``[DONE]`` included); else every NDJSON line (Ollama's).
    """
    async for raw in response.content:
        line = raw.strip()
        if events:
            if not line.startswith(b"data: "):
                continue
            line = line.removeprefix(b"data: ")
        if line:
            yield line
