"""The gateway under a steady load: N requests, C at a time, to a real llama-server, errors counted.

Not part of the test suite (it runs for minutes) and not collected by it: ``python -m
tests.gateway.soak`` runs it (with ``--requests`` and ``--concurrency``, passed here in
``SOAK_REQUESTS`` / ``SOAK_CONCURRENCY``). Home Assistant's HTTP app runs on loopback as in the
gateway tests (``AppRunner``, the test harness), LLM Lanes in front of a real ``llama-server``
(``tests.support.llamacpp``: built from source, a tiny random model, 4 slots) with its default
settings, and one client in the interactive lane. ``C`` workers each send requests one after the
other until ``N`` are sent, with a plain aiohttp client, rotating over what apps send: an OpenAI
chat streamed, an OpenAI chat not streamed, an Ollama chat streamed.

A request counts as ``ok`` when it answered 200 and, streamed, ended as its API ends a stream
(``[DONE]``, Ollama's ``"done": true``) with no error event in between; otherwise it is counted
under its status and the API's error code, or as ``stream error`` / ``truncated`` / the client
exception. The table is printed; any error fails the run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
import json
import os
import sys
import time
from typing import Any, Final

import aiohttp
from homeassistant.core import HomeAssistant
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tests.support.llamacpp import LlamaServer

from .conftest import ClientKey, Gateway
from .samples import stream_lines

REQUESTS: Final = int(os.environ.get("SOAK_REQUESTS", "300"))
CONCURRENCY: Final = int(os.environ.get("SOAK_CONCURRENCY", "16"))
MAX_TOKENS: Final = int(os.environ.get("SOAK_MAX_TOKENS", "8"))
KINDS: Final = ("openai stream", "openai", "ollama stream")
OK: Final = "ok"
MESSAGES: Final = [{"role": "user", "content": "Is the kitchen light on?"}]

pytestmark = pytest.mark.llamacpp


async def _outcome(response: aiohttp.ClientResponse, kind: str) -> tuple[str, str]:
    """Read an answer to its end; return ``ok`` or what went wrong, and the error message."""
    if response.status != 200:
        try:
            error = (await response.json())["error"]
        except ValueError, KeyError, TypeError, aiohttp.ClientError:
            return f"{response.status}", ""
        if isinstance(error, dict):
            return f"{response.status} {error.get('code')}", str(error.get("message"))
        return f"{response.status}", str(error)
    if kind == "openai":
        body = await response.json()
        return (OK, "") if body["choices"] else ("no choices", str(body))
    ended = False
    async for line in stream_lines(response, events=kind == "openai stream"):
        if line == b"[DONE]":
            ended = True
            continue
        event = json.loads(line)
        if "error" in event:
            return "stream error", str(event["error"])
        if kind == "ollama stream" and event.get("done"):
            ended = True
    return (OK, "") if ended else ("truncated", "")


async def _send(
    session: aiohttp.ClientSession,
    gateway: Gateway,
    client: ClientKey,
    model: str,
    kind: str,
) -> tuple[str, str]:
    """Send one request of ``kind``; return its outcome and the error message."""
    if kind.startswith("openai"):
        url = f"{gateway.openai_url}/chat/completions"
        body: dict[str, Any] = {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": MAX_TOKENS,
            "stream": kind == "openai stream",
        }
        headers = {"Authorization": f"Bearer {client.api_key}"}
    else:
        url = f"{gateway.ollama_url(client.api_key)}/api/chat"
        body = {
            "model": model,
            "messages": MESSAGES,
            "options": {"num_predict": MAX_TOKENS},
        }
        headers = {}
    try:
        async with session.post(url, json=body, headers=headers) as response:
            return await _outcome(response, kind)
    except (aiohttp.ClientError, TimeoutError) as err:
        return f"client {type(err).__name__}", str(err)


async def test_gateway_soak(
    hass: HomeAssistant,
    gateway: Gateway,
    llama_entry: MockConfigEntry,
    llama_server: LlamaServer,
) -> None:
    """Send the requests, print the outcomes by kind, and fail on any error.

    The harness's event-loop debug mode is turned off for the run, as Home Assistant runs
    without it.
    """
    loop = asyncio.get_running_loop()
    debug = loop.get_debug()
    loop.set_debug(False)
    try:
        await _soak(gateway, llama_entry, llama_server.model_name)
    finally:
        loop.set_debug(debug)


async def _soak(gateway: Gateway, entry: MockConfigEntry, model: str) -> None:
    client = await gateway.add_client(entry, name="Soak")
    outcomes: Counter[tuple[str, str]] = Counter()
    messages: dict[tuple[str, str], str] = {}
    numbers = iter(range(REQUESTS))
    started = time.perf_counter()

    async def worker(session: aiohttp.ClientSession) -> None:
        for number in numbers:
            kind = KINDS[number % len(KINDS)]
            outcome, message = await _send(session, gateway, client, model, kind)
            outcomes[kind, outcome] += 1
            messages.setdefault((kind, outcome), message)

    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(CONCURRENCY)))
    wall = time.perf_counter() - started

    errors = {key: count for key, count in outcomes.items() if key[1] != OK}
    rows = [
        f"| {kind} | {outcome} | {count} | {messages[kind, outcome][:200]} |"
        for (kind, outcome), count in sorted(outcomes.items())
    ]
    table = "\n".join(
        ["| request | outcome | count | first message |", "|---|---|---|---|", *rows]
    )
    sys.stdout.write(
        f"\n{REQUESTS} gateway requests, {CONCURRENCY} at a time, to a real llama-server "
        f"(4 slots), {MAX_TOKENS} output tokens each, in {wall:.1f} s: "
        f"{sum(errors.values())} errors\n{table}\n"
    )
    assert sum(outcomes.values()) == REQUESTS
    assert not errors, errors
