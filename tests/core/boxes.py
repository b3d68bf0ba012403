"""Servers of a household for the pool's tests: the in-process engine behind a power switch.

A ``Box`` is a machine running an LLM server (``tools/simulator/inprocess.py``: the simulator's
continuous-batching engine, llama.cpp-like, on the loop's virtual clock). It can be killed (new
connections are refused, and every stream it was sending breaks at its next token, as a
connection reset), booted again after some seconds (what a wake action starts), or made to hang
(it accepts requests and never answers). Its health check answers while it is powered.

``run_virtual`` runs a test's coroutine on a ``VirtualTimeLoop``: minutes of serving, waking and
idling cost milliseconds, the same way every run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

from custom_components.llm_lanes.core.backends.base import (
    Backend,
    PrefillStep,
    ServerInfo,
    ServerMetrics,
)
from custom_components.llm_lanes.core.backends.kinds import ServerKind, server_profile
from custom_components.llm_lanes.core.errors import BackendConnectionError
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest, StreamChunk
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens
from tools.simulator.engine import EngineCosts
from tools.simulator.inprocess import EngineBackend, answer_text, filler
from tools.simulator.virtual_time import VirtualTimeLoop

GPU_COSTS = EngineCosts()
"""A consumer GPU's costs (the simulator's defaults: ~6,700 prompt tokens/s, ~10 ms a token)."""
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


class Box(Backend):
    """A machine with an LLM server on it (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        costs: EngineCosts = GPU_COSTS,
        slots: int = 4,
        powered: bool = True,
    ) -> None:
        """Set the machine up (inside the running loop); ``powered``: it runs from the start."""
        super().__init__(server_profile(ServerKind.LLAMA_CPP))
        self.name = name
        self.base_url = f"http://{name}.lan:8080"
        self.server = EngineBackend(slots=slots, costs=costs)
        self.chooses_slots = True
        self.prefills_in_steps = True
        self.powered = powered
        self.hangs = False
        """Accepts requests and never answers them."""
        self.boots = 0
        self.requests: list[ChatRequest] = []
        """Every chat request it accepted."""
        self._generation = 0
        self._hang = asyncio.Event()

    # --- the power switch ---------------------------------------------------------------------

    def kill(self) -> None:
        """Cut the power: streams break at their next token, connections are refused."""
        self.powered = False
        self._generation += 1

    def boot(self, after_s: float = 0.0) -> None:
        """Power the machine on ``after_s`` seconds from now (what a wake action does)."""
        asyncio.get_running_loop().call_later(after_s, self._power_on)

    def _power_on(self) -> None:
        self.powered = True
        self.boots += 1

    async def health(self) -> bool:
        """Answer while powered (a health check)."""
        return self.powered

    def _check(self) -> None:
        if not self.powered:
            raise BackendConnectionError(f"{self.base_url} refused the connection")

    # --- the server -------------------------------------------------------------------------------

    async def server_info(self) -> ServerInfo:
        """Describe the server (while powered)."""
        self._check()
        return await self.server.server_info()

    async def list_models(self) -> tuple[str, ...]:
        """List the models (while powered)."""
        self._check()
        return await self.server.list_models()

    async def metrics(self) -> ServerMetrics:
        """Report the load (while powered)."""
        self._check()
        return await self.server.metrics()

    async def warm_up(self, model: str) -> bool:
        """Say the model is loaded (while powered)."""
        self._check()
        return True

    async def render_prompt(self, request: ChatRequest) -> str:
        """Render a prompt (while powered)."""
        self._check()
        return await self.server.render_prompt(request)

    async def prefill(self, model: str, text: str, slot: int) -> PrefillStep:
        """Prefill a slot (while powered)."""
        self._check()
        return await self.server.prefill(model, text, slot)

    def chat(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Stream from the engine until the power goes."""
        return self._chat(request)

    async def _chat(self, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
        self._check()
        self.requests.append(request)
        if self.hangs:
            await self._hang.wait()
        generation = self._generation
        stream = self.server.chat(request)
        assert isinstance(stream, AsyncGenerator)
        try:
            async for chunk in stream:
                if self._generation != generation:
                    raise BackendConnectionError(
                        f"{self.base_url} reset the connection"
                    )
                yield chunk
        finally:
            await stream.aclose()


def words(start: int, count: int) -> str:
    """Return the answer's tokens ``start`` to ``start + count`` as the boxes stream them."""
    return answer_text(start, count)
