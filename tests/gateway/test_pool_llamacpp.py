"""Two real llama-servers as one pool, behind the gateway and the agent.

A *GPU box* and a *mini PC*, each a real ``llama-server`` (built from source, the tiny model, one
thread each: ``tests/support/llamacpp.py``), each an LLM Lanes entry; the GPU box is every
lane's first choice. Clients of the pool (real ``openai`` clients through the gateway) in the
voice, interactive and background lanes, and an Assist agent of the pool.

- The GPU box is killed with SIGKILL while voice commands, typed chats and background answers
  stream: no request fails, every stream that had begun goes on on the mini PC as one stream to
  its caller (all its tokens, one ``[DONE]``), and once the GPU box is back routing returns to
  it. Voice's time to first token during the kill against its idle figure (measured first, in
  the same test) is printed (``-s``): the figure of the README.
- The GPU box sleeps at start: a job due on it presses its wake button (a template button whose
  action starts its llama-server), waits and runs there; a voice command meanwhile is answered
  by the mini PC at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import contextlib
from dataclasses import dataclass
import statistics
import time
from typing import Any

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import ServiceCall
import openai
import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_capture_events,
)

from custom_components.llm_lanes.const import CONF_POOL, EVENT_REQUEST_FINISHED
from custom_components.llm_lanes.core.availability import ServerState
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.household import household_of
from tests.support.entries import async_set_up
from tests.support.llamacpp import MODEL_ALIAS, LlamaServer, free_port
from tests.support.llamacpp_slots import kill_mid_answers
from tests.support.pool import (
    async_set_up_sleeping_gpu,
    async_set_up_wake_button,
    async_voice_command,
    pool_member_entry,
    start_job,
)
from tests.support.requests import async_wait_for

from .conftest import Gateway

pytestmark = pytest.mark.llamacpp

EVERYWHERE_FIRST = dict.fromkeys(
    (Lane.VOICE, Lane.INTERACTIVE, Lane.AUTOMATION, Lane.BACKGROUND), 1
)
EVERYWHERE_SECOND = dict.fromkeys(EVERYWHERE_FIRST, 2)
VOICE: list[Any] = [{"role": "user", "content": "Turn on the kitchen light."}]
STORY: list[Any] = [{"role": "user", "content": "Tell me a long story."}]
IDLE_COMMANDS = 40
LOADED_COMMANDS = 120
"""Every fifth a spoken command to the agent, the others (96) through the gateway."""
GPU_AGENT = "conversation.gpu_agent"


def _server(port: int | None = None) -> LlamaServer:
    return LlamaServer(parallel=4, threads=1, context_per_slot=1024, port=port)


@dataclass
class Boxes:
    """The two entries, their servers and the pool's clients."""

    gpu: MockConfigEntry
    mini: MockConfigEntry
    gpu_server: LlamaServer
    voice: openai.AsyncOpenAI
    chat: openai.AsyncOpenAI
    background: openai.AsyncOpenAI


@pytest.fixture
async def boxes(gateway: Gateway) -> AsyncIterator[Boxes]:
    """Start both llama-servers, set up their entries and the pool's clients."""
    hass = gateway.hass
    servers = [_server(), _server()]
    await asyncio.gather(*(server.__aenter__() for server in servers))
    entries: list[MockConfigEntry] = []
    try:
        for server, title, ranks, agent in (
            (servers[0], "GPU box", EVERYWHERE_FIRST, "GPU agent"),
            (servers[1], "Mini PC", EVERYWHERE_SECOND, "Mini agent"),
        ):
            entries.append(
                await async_set_up(
                    hass,
                    pool_member_entry(
                        server.url, title, ranks, model=MODEL_ALIAS, agent=agent
                    ),
                )
            )
        gpu, mini = entries

        async def client(lane: str) -> openai.AsyncOpenAI:
            key = await gateway.add_client(
                gpu, name=lane, lane=lane, **{CONF_POOL: True}
            )
            return gateway.openai(key.api_key)

        home = Boxes(
            gpu,
            mini,
            servers[0],
            await client("voice"),
            await client("interactive"),
            await client("background"),
        )
        yield home
        servers[0] = home.gpu_server  # restarted by the test
    finally:
        for entry in entries:
            if entry.state is ConfigEntryState.LOADED:
                assert await hass.config_entries.async_unload(entry.entry_id)
        await asyncio.gather(*(asyncio.to_thread(server.stop) for server in servers))


async def _voice(api: openai.AsyncOpenAI) -> float:
    """Send one voice command through the gateway; return its time to the first token."""
    started = time.monotonic()
    first: float | None = None
    done = False
    stream = await api.chat.completions.create(
        model=MODEL_ALIAS,
        messages=VOICE,
        stream=True,
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    async for event in stream:
        if first is None and event.choices and event.choices[0].delta.content:
            first = time.monotonic() - started
        if event.choices and event.choices[0].finish_reason:
            done = True
    assert first is not None and done
    return first


@dataclass
class Story:
    """A long answer streamed through the gateway: its tokens, and whether it began before the kill."""

    tokens: int
    began: asyncio.Event
    text: str = ""
    finish: str | None = None


async def _story(api: openai.AsyncOpenAI, story: Story) -> Story:
    """Stream a long answer (``ignore_eos``: exactly its tokens) to its end."""
    stream = await api.chat.completions.create(
        model=MODEL_ALIAS,
        messages=STORY,
        stream=True,
        max_tokens=story.tokens,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage = None
    async for event in stream:
        if event.choices:
            story.text += event.choices[0].delta.content or ""
            if story.text:
                story.began.set()
            story.finish = event.choices[0].finish_reason or story.finish
        if event.usage is not None:
            usage = event.usage
    assert usage is not None
    story.tokens = usage.completion_tokens
    return story


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


async def test_the_preferred_box_killed_mid_stream_loses_no_request(
    gateway: Gateway, boxes: Boxes
) -> None:
    """SIGKILL of the GPU box under voice, chats and background: nothing fails, nothing breaks."""
    hass = gateway.hass
    pool = household_of(hass)
    gpu_id, mini_id = boxes.gpu.entry_id, boxes.mini.entry_id
    events = async_capture_events(hass, EVENT_REQUEST_FINISHED)

    idle = [await _voice(boxes.voice) for _ in range(IDLE_COMMANDS)]
    assert {event.data["server"] for event in events} == {gpu_id}
    idle_p95 = _p95(idle)
    # The mini PC of a household has been answering too: warm, like the GPU box.
    for _ in range(5):
        await boxes.mini.runtime_data.scheduler.generate(
            ChatRequest(
                model=MODEL_ALIAS,
                messages=(ChatMessage(role="user", content="warm up"),),
                max_tokens=8,
            ),
            lane=Lane.VOICE,
            requester="job:warm",
        )
    events.clear()

    stories = [Story(600, asyncio.Event()), Story(800, asyncio.Event())]
    lengths = {story.tokens for story in stories}
    streams = [
        asyncio.create_task(_story(boxes.chat, stories[0])),
        asyncio.create_task(_story(boxes.background, stories[1])),
    ]
    loaded: list[float] = []
    agent_answers: list[str] = []

    async def commands() -> None:
        for index in range(LOADED_COMMANDS):
            if index % 5 == 4:  # every fifth one is a spoken command to the agent
                agent_answers.append(await async_voice_command(hass, GPU_AGENT))
            else:
                loaded.append(await _voice(boxes.voice))
            await asyncio.sleep(0.05)

    voice = asyncio.create_task(commands())
    # Killed while both stories stream there, each with tokens sent and tokens to go, from a
    # worker thread: the client is no clock for it (a loaded machine's event loop relays the
    # tokens seconds behind the server, which writes a story in about a second).
    await asyncio.to_thread(kill_mid_answers, boxes.gpu_server, lengths)
    killed_at = len(events)
    finished = await asyncio.gather(*streams, voice, return_exceptions=True)
    failures = [result for result in finished if isinstance(result, BaseException)]
    assert failures == []

    # Every stream that had begun went on on the mini PC: all its tokens, ended once.
    for story in stories:
        assert story.finish == "length"
        assert story.tokens in (600, 800)
    answers = [e.data for e in events if e.data["lane"] != "voice"]
    assert len(answers) == len(stories)
    assert all(
        (a["outcome"], a["server"], a["resumed_on"]) == ("ok", mini_id, mini_id)
        for a in answers
    ), answers
    assert all(event.data["outcome"] == "ok" for event in events)
    assert len(agent_answers) == LOADED_COMMANDS // 5 and all(agent_answers)
    # After the kill everything went to the mini PC (but the one command that may have been
    # ending its answer on the GPU box as it died: the commands go one after the other).
    after = [e.data["server"] for e in events[killed_at:]]
    assert after.count(gpu_id) <= 1 and after[-1] == mini_id
    # Voice's time to first token is printed, not asserted: timings on a shared 2-core machine
    # are the benchmark's to judge, side by side (README, *Several servers*).
    loaded_p95 = _p95(loaded)

    # The GPU box comes back on its port: the probe finds it, voice goes to it again.
    restarted = _server(port=boxes.gpu_server.port)
    boxes.gpu_server = restarted
    await restarted.__aenter__()
    async with asyncio.timeout(30):
        await async_wait_for(lambda: pool.state(gpu_id) is ServerState.UP, limit=10**7)
    await _voice(boxes.voice)
    assert events[-1].data["server"] == gpu_id
    print(  # noqa: T201 - the figures of the run, for the README
        f"voice TTFT p95 idle {idle_p95 * 1000:.1f} ms, "
        f"during the kill {loaded_p95 * 1000:.1f} ms ({loaded_p95 / idle_p95:.2f}x); "
        f"failovers {sum(e.data['failovers'] for e in events)}, "
        f"slowest {sorted(round(x * 1000) for x in loaded)[-5:]} ms"
    )


async def test_a_job_wakes_the_sleeping_box_that_starts_its_llama_server(
    gateway: Gateway,
) -> None:
    """The GPU box's llama-server is not running: its job presses the wake button, which starts it.

    The job waits and runs there; a voice command during the wait goes to the mini PC.
    """
    hass = gateway.hass
    port = free_port()
    gpu_server = _server(port=port)
    pressed = asyncio.Event()
    booted = asyncio.Event()

    async def boot(_call: ServiceCall) -> None:
        pressed.set()
        await booted.wait()  # the voice command comes first
        await gpu_server.__aenter__()

    await async_set_up_wake_button(hass, boot)
    mini_server = _server()
    await mini_server.__aenter__()
    entries: list[MockConfigEntry] = []
    try:
        gpu = await async_set_up_sleeping_gpu(
            hass, f"http://127.0.0.1:{port}", EVERYWHERE_FIRST, model=MODEL_ALIAS
        )
        entries.append(gpu)
        mini = await async_set_up(
            hass,
            pool_member_entry(
                mini_server.url,
                "Mini PC",
                {**EVERYWHERE_SECOND, Lane.BACKGROUND: 0},
                model=MODEL_ALIAS,
                agent="Mini agent",
            ),
        )
        entries.append(mini)
        pool = household_of(hass)
        assert pool.state(gpu.entry_id) is ServerState.ASLEEP
        events = async_capture_events(hass, EVENT_REQUEST_FINISHED)
        job = start_job(
            hass,
            gpu,
            "The hall light was on all night; the back door opened at 6.",
            max_output_tokens=24,
        )
        async with asyncio.timeout(30):
            await pressed.wait()
        assert pool.state(gpu.entry_id) is ServerState.WAKING
        # It cannot wait for the wake: the GPU box boots only once it is answered.
        async with asyncio.timeout(60):  # a hang guard
            assert await async_voice_command(hass, GPU_AGENT)
        assert [event.data["server"] for event in events] == [mini.entry_id]
        booted.set()
        async with asyncio.timeout(120):
            response = await job
        assert response["status"] == "done", response
        assert response["output_tokens"] > 0
        await hass.async_block_till_done()
        assert (events[-1].data["server"], events[-1].data["lane"]) == (
            gpu.entry_id,
            "background",
        )
    finally:
        booted.set()
        for entry in entries:
            if entry.state is ConfigEntryState.LOADED:
                assert await hass.config_entries.async_unload(entry.entry_id)
        with contextlib.suppress(Exception):
            await asyncio.gather(
                asyncio.to_thread(gpu_server.stop), asyncio.to_thread(mini_server.stop)
            )
