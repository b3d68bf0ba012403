"""A server counts a prompt before it runs, as it will charge it (``core.backends.prompt_counts``).

Against a real llama-server: the count (``/apply-template`` then ``/tokenize``) equals the
``usage.prompt_tokens`` the chat then reports, with a system prompt, with tools, and for a raw
completion. A server without those endpoints is asked once. vLLM's ``/tokenize`` is played by a
loopback server that answers as vLLM documents it, to check what is sent.
"""

from __future__ import annotations

import aiohttp
import pytest

from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.ollama import OllamaBackend
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.errors import BackendHTTPError
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    ToolSpec,
)
from tests.support.llamacpp import LlamaServer

from .conftest import Serve, json_handler

MODEL = "tiny-random-llama"
LIGHT_TOOL = ToolSpec(
    name="turn_on",
    description="Turn on the lights of a room",
    parameters={
        "type": "object",
        "properties": {"room": {"type": "string"}},
        "required": ["room"],
    },
)
CHATS = {
    "plain": ChatRequest(
        model=MODEL,
        messages=(ChatMessage(role="user", content="Dim the hall lights."),),
        max_tokens=2,
    ),
    "system and tools": ChatRequest(
        model=MODEL,
        messages=(
            ChatMessage(role="system", content="You control a house. Be brief."),
            ChatMessage(role="user", content="Turn on the kitchen, please."),
        ),
        tools=(LIGHT_TOOL,),
        max_tokens=2,
    ),
    "raw completion": CompletionRequest(
        model=MODEL, messages=(), prompt="The kitchen light is", max_tokens=2
    ),
}


@pytest.mark.llamacpp
@pytest.mark.parametrize("name", list(CHATS))
async def test_llama_cpp_counts_as_it_charges(
    llama_server: LlamaServer, session: aiohttp.ClientSession, name: str
) -> None:
    """The count before the chat is the prompt the chat's usage reports."""
    backend = OpenAIBackend(session, llama_server.url, kind=ServerKind.LLAMA_CPP)
    request = CHATS[name]
    counted = await backend.count_prompt_tokens(request)
    chunks = [chunk async for chunk in backend.chat(request)]
    usage = chunks[-1].usage
    assert usage is not None and usage.source == "server"
    assert counted == usage.prompt_tokens


@pytest.mark.llamacpp
async def test_embeddings_are_not_counted(
    llama_server: LlamaServer, session: aiohttp.ClientSession
) -> None:
    """Only chats and completions are counted."""
    backend = OpenAIBackend(session, llama_server.url, kind=ServerKind.LLAMA_CPP)
    request = EmbeddingRequest(model=MODEL, messages=(), inputs=("kitchen",))
    assert await backend.count_prompt_tokens(request) is None


async def test_a_server_without_the_endpoints_is_asked_once(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    """An older llama-server (404 at ``/apply-template``): the error, then no more asking."""
    server = await serve({})
    backend = OpenAIBackend(session, server.url, kind=ServerKind.LLAMA_CPP)
    assert backend.counts_prompts
    with pytest.raises(BackendHTTPError):
        await backend.count_prompt_tokens(CHATS["plain"])
    assert not backend.counts_prompts
    assert await backend.count_prompt_tokens(CHATS["plain"]) is None


async def test_vllm_counts_the_chat_with_its_template(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    """VLLM's ``/tokenize`` gets the messages and tools and answers the count."""
    server = await serve(
        {"POST /tokenize": json_handler({"count": 57, "max_model_len": 8192})}
    )
    backend = OpenAIBackend(session, server.url, kind=ServerKind.VLLM)
    assert await backend.count_prompt_tokens(CHATS["system and tools"]) == 57
    resumed = ChatRequest(
        model=MODEL, messages=CHATS["plain"].messages, assistant_prefix="Sure"
    )
    assert await backend.count_prompt_tokens(resumed) == 57
    chat, continued = server.received["/tokenize"]
    assert chat["model"] == MODEL
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]
    assert chat["tools"][0]["function"]["name"] == "turn_on"
    # An answer being continued is counted as the chat sends it: the final message left open.
    assert continued["messages"][-1] == {"role": "assistant", "content": "Sure"}
    assert continued["continue_final_message"] is True
    assert continued["add_generation_prompt"] is False


@pytest.mark.parametrize("kind", [ServerKind.LM_STUDIO, ServerKind.LOCALAI])
async def test_servers_that_cannot_count_are_not_asked(
    serve: Serve, session: aiohttp.ClientSession, kind: ServerKind
) -> None:
    """LM Studio, LocalAI (and Ollama) document no template count: nothing is sent."""
    server = await serve({})
    backend = OpenAIBackend(session, server.url, kind=kind)
    assert not backend.counts_prompts
    assert await backend.count_prompt_tokens(CHATS["plain"]) is None
    ollama = OllamaBackend(session, server.url)
    assert await ollama.count_prompt_tokens(CHATS["plain"]) is None
    assert server.received == {}
