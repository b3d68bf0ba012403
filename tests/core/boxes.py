"""Servers of a household for the pool's tests: the in-process engine behind a power switch.

A ``Box`` (``tools/simulator/box.py``) is a machine running an LLM server: the simulator's
continuous-batching engine, llama.cpp-like, on the loop's virtual clock. It can be killed (new
connections are refused, and every stream it was sending breaks at its next token, as a
connection reset), booted again after some seconds (what a wake action starts), or made to hang
(it accepts requests and never answers). Its health check answers while it is powered.

``run_virtual`` runs a test's coroutine on a ``VirtualTimeLoop``: minutes of serving, waking and
idling cost milliseconds, the same way every run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens
from tools.simulator.box import Box
from tools.simulator.engine import GPU_COSTS, EngineCosts
from tools.simulator.inprocess import answer_text, filler
from tools.simulator.virtual_time import VirtualTimeLoop

__all__ = [
    "GPU_COSTS",
    "MINI_PC_COSTS",
    "Box",
    "now",
    "request",
    "run_virtual",
    "words",
]
MINI_PC_COSTS = EngineCosts(
    fixed_s=0.02, per_prefill_token_s=0.002, per_decode_seq_s=0.03
)
"""A mini PC's CPU: 500 prompt tokens/s, ~50 ms a token alone."""

ASSIST_PROMPT = filler(2000, "assist")
"""A 2,000-token Assist system prompt (exposed entities, tool schemas), the same for every command."""


def run_virtual[T](main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on a virtual-time event loop and return its result."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main())


def now() -> float:
    """Return the running loop's (virtual) time."""
    return asyncio.get_running_loop().time()


def request(
    text: str = "turn on the kitchen light",
    *,
    system: str | None = ASSIST_PROMPT,
    history: tuple[ChatMessage, ...] = (),
    answer_tokens: int = 8,
    model: str = "",
    **fields: Any,
) -> ChatRequest:
    """Build a chat request the boxes answer with ``answer_tokens`` tokens ``w0 w1 ...``.

    Its prompt size, as the engine charges it, is the scheduler's own estimate.
    """
    messages = (
        *((ChatMessage(role="system", content=system),) if system is not None else ()),
        *history,
        ChatMessage(role="user", content=text),
    )
    built = ChatRequest(model=model, messages=messages, **fields)
    return ChatRequest(
        model=model,
        messages=messages,
        options={
            "prompt_tokens": estimate_prompt_tokens(built),
            "answer_tokens": answer_tokens,
        },
        **fields,
    )


def words(start: int, count: int) -> str:
    """Return the answer's tokens ``start`` to ``start + count`` as the boxes stream them."""
    return answer_text(start, count)
