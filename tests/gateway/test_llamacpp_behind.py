"""The gateway in front of a real llama.cpp ``llama-server`` (built from source, tiny model).

Real clients on both endpoints, a raw completion, and a client that disconnects mid-stream:
its slot at the server (``/slots``) is freed, which only the disconnect can do (the answer
holds its slot until the client goes away).
"""

from __future__ import annotations

import asyncio
import contextlib

from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.core.backends.openai import OpenAIBackend
from custom_components.llm_lanes.core.lanes import Lane
from tests.support.entries import async_llama_entry
from tests.support.llamacpp import LlamaServer
from tests.support.llamacpp_slots import HELD_ANSWER_TOKENS, holding_server
from tests.support.requests import async_look_until, async_wait_for, finished_requests

from .conftest import Gateway
from .samples import delta_texts, long_stream

pytestmark = pytest.mark.llamacpp

HELLO = [{"role": "user", "content": "Tell me about the kitchen lights."}]


async def test_both_endpoints_in_front_of_llama_server(
    gateway: Gateway,
    llama_entry: MockConfigEntry,
    llama_server: LlamaServer,
) -> None:
    """OpenAI chat (streamed), raw completion and an Ollama chat, all through the scheduler."""
    model = llama_server.model_name
    client, api = await gateway.add_openai_client(llama_entry, lane="voice")
    finished = finished_requests(llama_entry)

    stream = await api.chat.completions.create(
        model=model,
        messages=HELLO,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=12,
        temperature=0,
    )
    events = [event async for event in stream]
    texts = delta_texts(events)
    assert texts
    assert events[-1].usage is not None
    assert events[-1].usage.completion_tokens == 12  # the server's own count

    completed = await api.completions.create(
        model=model, prompt="The kitchen light is", max_tokens=6, temperature=0
    )
    assert completed.choices[0].text
    assert completed.usage is not None and completed.usage.completion_tokens == 6

    answer = await gateway.ollama(client.api_key).chat(
        model=model, messages=HELLO, options={"num_predict": 5, "temperature": 0}
    )
    assert answer.message.content
    assert answer.eval_count == 5
    assert [(f.lane, f.requester, f.outcome, f.token_source) for f in finished] == [
        (Lane.VOICE, client.requester, "ok", "server")
    ] * 3


async def test_disconnect_frees_the_llama_server_slot(
    hass: HomeAssistant, gateway: Gateway
) -> None:
    """A client that closes its stream mid-answer: the server frees the slot it would have held.

    The answer holds its slot until the client goes away (its own server goes on past a full
    slot): only the disconnect can free it, whatever the machine's speed.
    """
    async with (
        holding_server() as server,
        async_llama_entry(hass, server, "llama.cpp (holding)") as entry,
    ):
        await _disconnect_frees_the_slot(gateway, entry, server)


async def _disconnect_frees_the_slot(
    gateway: Gateway, llama_entry: MockConfigEntry, llama_server: LlamaServer
) -> None:
    backend = llama_entry.runtime_data.backend
    assert isinstance(backend, OpenAIBackend)
    client = await gateway.add_client(llama_entry)
    # After the client (its settings apply then): the lane caps answers at the slot's 1,024.
    scheduler = llama_entry.runtime_data.scheduler
    scheduler.update_settings(
        scheduler.settings.with_lane(
            Lane.INTERACTIVE, max_output_tokens=HELD_ANSWER_TOKENS
        )
    )
    finished = finished_requests(llama_entry)
    assert await backend.slots_busy() == 0
    predicted = (await backend.metrics()).output_tokens_total

    busy_seen: list[int | None] = []

    async def watch_slots() -> None:
        # Polled back to back from before the request: a tiny model answers fast on a fast
        # machine, so one look after the first tokens could come after the answer's end.
        while True:
            busy_seen.append(await backend.slots_busy())

    watcher = asyncio.create_task(watch_slots())
    stream = await long_stream(
        gateway.openai(client.api_key), llama_server.model_name, HELD_ANSWER_TOKENS
    )
    events = aiter(stream)
    await anext(events)
    await anext(events)
    await async_wait_for(lambda: 1 in busy_seen)
    await stream.close()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher

    async def idle() -> bool:
        return not await backend.slots_busy()

    await async_look_until(idle)
    generated = (await backend.metrics()).output_tokens_total
    assert generated is not None and predicted is not None
    # Freed by the client's going away, not by the answer's end (the tokens the server says it
    # generated tell, not a clock).
    assert generated - predicted < HELD_ANSWER_TOKENS
    await async_wait_for(lambda: finished != [])
    assert [f.outcome for f in finished] == ["cancelled"]
    assert finished[0].output_tokens < HELD_ANSWER_TOKENS
