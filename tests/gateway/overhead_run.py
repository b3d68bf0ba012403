"""The gateway's own cost at idle: voice commands to a real llama-server, bare and through it.

Not part of the test suite (it measures wall-clock time; run it on an idle machine) and not
collected by it: ``python -m tests.gateway.bench_overhead`` runs it. It starts a real
``llama-server`` (``tests.support.llamacpp``: the tiny random model, 4 slots of 4,096 tokens)
and Home Assistant's HTTP server (the test harness's, on loopback) with LLM Lanes in front of it
and a client in the voice lane, then, in one run:

1. **Overhead**: ``ROUNDS`` pairs of voice commands after a ~2,000-token Assist-like prompt
   (instructions, the exposed entities, the intent tools), one sent to the server itself and one
   through the OpenAI endpoint, both with a plain aiohttp client (no SDK in the way) and the
   same body, one at a time, alternating which goes first. The two of a pair are different
   commands, so neither finds the other's answer in the server's cache: each evaluates the
   cached prompt's end and its command, as Assist does. Time to first token of each (read to
   the end of the answer, as a voice pipeline does); the overhead is the difference of the
   medians (and the median of the pairs' differences).
2. **Concurrency** (``test_concurrent_streams``): ``STREAMS`` streams through the endpoint at
   once in front of a simulated llama.cpp with as many slots, each read to its end; every one
   must end with ``[DONE]`` and no error.

It prints tables for the README.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import json
import logging
import os
import statistics
import sys
import time
from typing import Any, Final

import aiohttp
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import (
    OPT_HEADROOM,
    OPT_MAX_SEQUENCES,
    OPT_PREFILL_BUDGET,
)
from custom_components.llm_lanes.core.metrics import percentile
from tests.support.entities import async_set_options
from tests.support.entries import MODEL, async_llama_entry
from tests.support.llamacpp import LlamaServer, running_llama_server
from tools.simulator.server import SimConfig

from .conftest import Gateway
from .samples import stream_lines

ROUNDS: Final = int(os.environ.get("OVERHEAD_ROUNDS", "200"))
WARM_UP: Final = 8
"""Pairs sent first and not counted (connections, the prompt into the slots, first imports)."""
MAX_TOKENS: Final = 8
STREAMS: Final = 200
TOKENS_PER_STREAM: Final = 16

COMMANDS: Final = tuple(
    f"{verb} {thing}"
    for verb, things in (
        ("Turn on", ("the kitchen light", "the hall light", "the fan", "the TV")),
        ("Turn off", ("the bedroom lamp", "the porch light", "the heater", "the radio")),
        ("What is", ("the temperature in the living room?", "the humidity upstairs?",
                     "the weather tomorrow?", "the time?")),
        ("Open", ("the garage door", "the blinds in the office", "the front gate")),
        ("Close", ("the garage door", "the blinds in the office", "the back door")),
        ("Set", ("the thermostat to 21 degrees", "the kitchen light to 40 percent",
                 "a timer for ten minutes", "the volume to 30")),
        ("Is", ("the front door locked?", "the washing machine done?",
                "anyone in the garden?", "the oven on?")),
        ("Lock", ("the front door", "the back door", "the shed", "the garage")),
        ("Play", ("some jazz in the kitchen", "the news", "rain sounds in the bedroom")),
        ("Dim", ("the living room lights", "the hall lights", "the bedroom lamp")),
        ("Start", ("the vacuum", "the dishwasher", "the coffee machine")),
        ("Stop", ("the vacuum", "the music", "the sprinklers")),
        ("How much", ("energy did we use today?", "solar did we make today?")),
        ("Add", ("milk to the shopping list", "eggs to the shopping list",
                 "call the plumber to my to-do list")),
        ("Pause", ("the TV", "the music in the kitchen")),
        ("Cancel", ("the timer", "the alarm")),
        ("Good", ("night", "morning", "evening")),
    )
    for thing in things
)  # fmt: skip
"""Voice commands of a household, as Assist's speech-to-text hands them over (54)."""

AREAS: Final = ("Kitchen", "Living room", "Hall")
DEVICES: Final = (
    ("light", "Ceiling light", "on", "brightness: 180"),
    ("light", "Lamp", "off", ""),
    ("switch", "Socket", "on", ""),
    ("sensor", "Temperature", "21.4 °C", ""),
    ("sensor", "Humidity", "48 %", ""),
    ("binary_sensor", "Motion", "off", ""),
    ("cover", "Blinds", "open", "current_position: 100"),
    ("media_player", "Speaker", "idle", "volume_level: 0.3"),
)
INTENTS: Final = (
    ("HassTurnOn", "Turns on/opens/presses a device or entity"),
    ("HassTurnOff", "Turns off/closes a device or entity"),
    ("HassLightSet", "Sets the brightness percentage or color of a light"),
    ("HassClimateSetTemperature", "Sets the target temperature of a climate device"),
    ("HassGetState", "Gets the current state of a device or entity"),
    ("HassMediaPause", "Pauses a media player"),
    ("HassMediaUnpause", "Resumes a media player"),
    ("HassSetVolume", "Sets the volume percentage of a media player"),
    ("HassStartTimer", "Starts a new timer"),
    ("HassCancelTimer", "Cancels a timer"),
    ("HassListAddItem", "Add item to a todo list"),
    (
        "GetLiveContext",
        "Provides real-time information about the current state of devices",
    ),
)


def _system_prompt() -> str:
    """Assist's system prompt for a home of 24 entities."""
    lines = [
        "You are a voice assistant for Home Assistant.",
        "Answer questions about the world truthfully.",
        "Answer in plain text. Keep it simple and to the point.",
        (
            "When controlling Home Assistant always call the intent tools. Use HassTurnOn to "
            "lock and HassTurnOff to unlock a lock. When controlling a device, prefer passing "
            "just name and domain. When controlling an area, prefer passing just area name and "
            "domain."
        ),
        (
            "When a user asks to turn on all devices of a specific type, ask user to specify an "
            "area, unless there is only one device of that type."
        ),
        "Current time is 19:42:07. Today's date is 2026-12-04.",
        "Static Context: An overview of the areas and the devices in this smart home:",
    ]
    for area in AREAS:
        for domain, name, state, attributes in DEVICES:
            slug = f"{area} {name}".lower().replace(" ", "_")
            lines += [
                f"- names: {area} {name}",
                f"  domain: {domain}",
                f"  entity_id: {domain}.{slug}",
                f"  state: '{state}'",
                f"  areas: {area}",
            ]
            if attributes:
                lines.append(f"  attributes:\n    {attributes}")
    return "\n".join(lines)


def _tools() -> list[dict[str, Any]]:
    """Return the intent tools Assist offers the model."""
    target = {
        "name": {"type": "string"},
        "area": {"type": "string"},
        "floor": {"type": "string"},
        "domain": {"type": "array", "items": {"type": "string"}},
    }
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": target},
            },
        }
        for name, description in INTENTS
    ]


SYSTEM: Final = _system_prompt()
TOOLS: Final = _tools()


def _body(model: str, command: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": command},
        ],
        "tools": TOOLS,
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


async def _first_token(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: Any
) -> tuple[float, int]:
    """Send one streamed chat, read it to its end; return its time to first token and prompt size."""
    started = time.perf_counter()
    first: float | None = None
    done = False
    prompt_tokens = 0
    async with session.post(
        f"{url}/chat/completions", json=body, headers=headers
    ) as response:
        assert response.status == 200, await response.text()
        async for payload in stream_lines(response, events=True):
            if payload == b"[DONE]":
                done = True
                continue
            event = json.loads(payload)
            assert "error" not in event, event
            if first is None and any(
                choice["delta"].get("content") or choice["delta"].get("tool_calls")
                for choice in event["choices"]
            ):
                first = time.perf_counter() - started
            if usage := event.get("usage"):
                prompt_tokens = usage["prompt_tokens"]
    assert done and first is not None
    return first, prompt_tokens


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


@pytest.fixture
async def assist_server() -> AsyncIterator[LlamaServer]:
    """Run a real llama-server with room in each slot for the Assist-like prompt."""
    async with running_llama_server(parallel=4, context_per_slot=4096) as server:
        yield server


async def test_gateway_overhead(
    hass: HomeAssistant, gateway: Gateway, assist_server: LlamaServer
) -> None:
    """Measure and print the idle overhead (the harness's loop debug mode off, as in production).

    The harness runs its event loop in debug mode, which records a traceback for every
    callback and future; Home Assistant does not, so neither does the measurement.
    """
    loop = asyncio.get_running_loop()
    debug = loop.get_debug()
    loop.set_debug(False)
    # Home Assistant logs aiohttp's access lines from WARNING up (bootstrap); the harness at INFO.
    access_log = logging.getLogger("aiohttp.access")
    access_level = access_log.level
    access_log.setLevel(logging.WARNING)
    try:
        async with async_llama_entry(hass, assist_server, "llama.cpp (real)") as entry:
            await _measure(gateway, entry, assist_server)
    finally:
        loop.set_debug(debug)
        access_log.setLevel(access_level)


async def _measure(
    gateway: Gateway, entry: MockConfigEntry, server: LlamaServer
) -> None:
    """Send the pairs, print the table."""
    client = await gateway.add_client(entry, name="Voice", lane="voice")
    # llama-server closes a streamed answer's connection while announcing keep-alive: a direct
    # client, like the gateway's backend, takes a connection of its own for each.
    bare = (f"{server.url}/v1", {"Connection": "close"})
    through = (gateway.openai_url, {"Authorization": f"Bearer {client.api_key}"})
    model = server.model_name
    times: dict[str, list[float]] = {"bare": [], "gateway": []}
    cpu: dict[str, list[float]] = {"bare": [], "gateway": []}
    prompt_tokens = 0
    load_before = os.getloadavg()[0]
    async with aiohttp.ClientSession() as session:
        for number in range(WARM_UP + ROUNDS):
            # The two commands of a pair are half the list apart: never the same.
            commands = {
                "bare": COMMANDS[number % len(COMMANDS)],
                "gateway": COMMANDS[(number + len(COMMANDS) // 2) % len(COMMANDS)],
            }
            order = ("bare", "gateway") if number % 2 else ("gateway", "bare")
            for path in order:
                url, headers = bare if path == "bare" else through
                started = time.process_time()
                ttft, prompt_tokens = await _first_token(
                    session, url, headers, _body(model, commands[path])
                )
                if number >= WARM_UP:
                    times[path].append(ttft)
                    cpu[path].append(time.process_time() - started)
    direct, gated = times["bare"], times["gateway"]
    pairs = [g - d for d, g in zip(direct, gated, strict=True)]
    p95 = {path: percentile(sorted(values), 0.95) for path, values in times.items()}
    rows = [
        ("TTFT p50, bare llama-server", _ms(statistics.median(direct))),
        ("TTFT p50, through the gateway", _ms(statistics.median(gated))),
        ("**gateway overhead p50** (difference of the medians)",
         f"**{_ms(statistics.median(gated) - statistics.median(direct))}**"),
        ("TTFT p95, bare / through the gateway",
         f"{_ms(p95['bare'])} / {_ms(p95['gateway'])} ({p95['gateway'] / p95['bare']:.2f}x)"),
        ("gateway overhead, median of the pairs' differences", _ms(statistics.median(pairs))),
        ("CPU time of this process per request p50, bare / through the gateway",
         f"{_ms(statistics.median(cpu['bare']))} / {_ms(statistics.median(cpu['gateway']))}"),
    ]  # fmt: skip
    table = "\n".join(
        ["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    )
    sys.stdout.write(
        f"\n{ROUNDS} pairs of voice commands ({prompt_tokens}-token prompt, {MAX_TOKENS} "
        f"output tokens), idle real llama-server, load {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after:\n{table}\n"
    )


@pytest.fixture
def sim_config() -> SimConfig:
    """Simulate an idle llama.cpp at real speed, with a slot for each concurrent stream."""
    return SimConfig(slots=STREAMS, speed=1.0, kv_capacity_tokens=STREAMS * 512)


async def test_concurrent_streams(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """``STREAMS`` streams at once through the endpoint: every one ends, none with an error."""
    loop = asyncio.get_running_loop()
    debug = loop.get_debug()
    loop.set_debug(False)
    try:
        await _concurrent(hass, gateway, init_integration)
    finally:
        loop.set_debug(debug)


async def _concurrent(
    hass: HomeAssistant, gateway: Gateway, entry: MockConfigEntry
) -> None:
    await async_set_options(
        hass,
        entry,
        **{
            OPT_MAX_SEQUENCES: STREAMS,
            OPT_PREFILL_BUDGET: 1_048_576,
            OPT_HEADROOM: 0,
            "interactive": {"max_queued": 256},
        },
    )
    client = await gateway.add_client(entry, name="Benchmark")
    headers = {"Authorization": f"Bearer {client.api_key}"}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": COMMANDS[0]}],
        "stream": True,
        "max_tokens": TOKENS_PER_STREAM,
        "ignore_eos": True,
    }
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                _stream(session, gateway.openai_url, headers, body)
                for _ in range(STREAMS)
            ),
            return_exceptions=True,
        )
        wall = time.perf_counter() - started
    errors = [r for r in results if isinstance(r, BaseException)]
    streams = [r for r in results if not isinstance(r, BaseException)]
    ttft = sorted(first for first, _ in streams)
    rows = [
        (f"{STREAMS} concurrent streams: errors", str(len(errors))),
        (f"{STREAMS} concurrent streams: tokens",
         f"{sum(streams_tokens for _, streams_tokens in streams)} of {STREAMS * TOKENS_PER_STREAM}"),
        (f"{STREAMS} concurrent streams: TTFT p50 / p95",
         " / ".join(_ms(percentile(ttft, q)) for q in (0.5, 0.95))),
        (f"{STREAMS} concurrent streams: wall time", f"{wall:.2f} s"),
    ]  # fmt: skip
    table = "\n".join(
        ["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    )
    sys.stdout.write(f"\nsimulated llama.cpp, {STREAMS} slots:\n{table}\n")
    assert not errors, errors[:3]
    assert all(tokens == TOKENS_PER_STREAM for _, tokens in streams)


async def _stream(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: Any
) -> tuple[float, int]:
    """Send one streamed chat; return its time to first token and its content pieces' count."""
    started = time.perf_counter()
    first: float | None = None
    pieces = 0
    done = False
    async with session.post(
        f"{url}/chat/completions", json=body, headers=headers
    ) as response:
        assert response.status == 200, await response.text()
        async for payload in stream_lines(response, events=True):
            if payload == b"[DONE]":
                done = True
                continue
            event = json.loads(payload)
            assert "error" not in event, event
            for choice in event["choices"]:
                if choice["delta"].get("content"):
                    if first is None:
                        first = time.perf_counter() - started
                    pieces += 1
    assert done and first is not None
    return first, pieces
