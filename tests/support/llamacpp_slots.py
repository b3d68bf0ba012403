"""A real llama-server's slots held by an answer, looked at, and killed in the middle of answers.

A test against a real server cannot take the client's side as its clock: the tiny model writes
an answer of hundreds of tokens in about a second, and a loaded machine's event loop can relay
them seconds later, in one go. So a test either holds a slot with an answer that does not end by
itself (``holding_server``, ``HELD_ANSWER_TOKENS``), or looks at the server itself (``/slots``)
and kills it in the same worker thread, with nothing of the event loop between the look and the
kill (``kill_mid_answers``; blocking: call it with ``asyncio.to_thread``).
"""

from __future__ import annotations

from collections.abc import Collection
import json
import time
from typing import Any
import urllib.request

from .llamacpp import LlamaServer

HELD_ANSWER_TOKENS = 1_000_000
"""An answer that does not end by itself in a test's time (minutes of tokens): it holds its slot
until the client goes away. Sent with ``ignore_eos`` to a ``holding_server``."""

LOOKS = 20_000
"""The most looks at ``/slots`` before giving up (a hang guard, not a time limit)."""


def holding_server() -> LlamaServer:
    """Return a server (one slot) whose answers go on past a full slot (``--context-shift``).

    Without it an answer ends where the slot is full; with it the server drops the oldest tokens
    and goes on, so a ``HELD_ANSWER_TOKENS`` answer holds the slot until it is cancelled.
    """
    return LlamaServer(parallel=1, extra_args=("--context-shift",))


def answering_slots(
    server: LlamaServer, lengths: Collection[int]
) -> list[dict[str, Any]]:
    """Return the slots answering a request of one of ``lengths`` tokens now (``n_predict``)."""
    with urllib.request.urlopen(f"{server.url}/slots", timeout=10) as answer:  # noqa: S310 (loopback)
        slots: list[dict[str, Any]] = json.load(answer)
    return [
        slot
        for slot in slots
        if slot.get("is_processing") and slot["params"].get("n_predict") in lengths
    ]


def kill_mid_answers(
    server: LlamaServer, lengths: Collection[int], *, margin: int = 20
) -> list[dict[str, Any]]:
    """Kill the server once an answer of each of ``lengths`` streams there, mid-way; return them.

    Mid-way: at least ``margin`` tokens written, and at least ``margin`` still to go.
    """
    for _ in range(LOOKS):
        answering = answering_slots(server, lengths)
        progress = [slot["next_token"][0] for slot in answering]
        if len(answering) == len(lengths) and all(
            token["n_decoded"] >= margin and token["n_remain"] >= margin
            for token in progress
        ):
            server.kill()
            return answering
        time.sleep(0.002)
    raise AssertionError(
        f"no answers of {sorted(lengths)} tokens streamed there at once"
    )
