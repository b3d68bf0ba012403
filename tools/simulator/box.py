"""A machine running the simulator's engine in-process, behind a power switch.

A ``Box`` is a server the pool's tests and ``scripts/bench --server engine`` can kill and start:
the in-process engine (``inprocess.py``: the simulator's continuous-batching engine, llama.cpp-like,
on the loop's clock, virtual time included) as one machine. It can be killed (new connections are
refused, and every stream it was sending breaks at its next token, as a connection reset),
powered on again at once or after some seconds (what a wake action starts), or made to hang (it
accepts requests and never answers). Its health check answers while it is powered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from custom_components.llm_lanes.core.backends.base import (
    Backend,
    PrefillStep,
    ServerInfo,
)
from custom_components.llm_lanes.core.backends.kinds import ServerKind, server_profile
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.core.errors import BackendConnectionError
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk
from tools.simulator.engine import GPU_COSTS, EngineCosts
from tools.simulator.inprocess import EngineBackend


class Box(Backend):
    """A machine with an LLM server on it (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        costs: EngineCosts = GPU_COSTS,
        slots: int = 4,
        powered: bool = True,
        chooses_slots: bool = True,
    ) -> None:
        """Set the machine up (inside the running loop); ``powered``: it runs from the start.

        ``chooses_slots``: the client picks the slot, as llama.cpp's does (else the engine does,
        as Ollama's runner).
        """
        super().__init__(server_profile(ServerKind.LLAMA_CPP))
        self.name = name
        self.base_url = f"http://{name}.lan:8080"
        self.server = EngineBackend(
            slots=slots, costs=costs, chooses_slots=chooses_slots
        )
        self.chooses_slots = chooses_slots
        self.prefills_in_steps = chooses_slots
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
        asyncio.get_running_loop().call_later(after_s, self.power_on)

    def power_on(self) -> None:
        """Power the machine on now (nothing if it runs)."""
        if not self.powered:
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

    async def busy_slots(self) -> frozenset[int] | None:
        """Report the slots holding a sequence, as ``/slots`` says (while powered)."""
        self._check()
        return await self.server.busy_slots() if self.chooses_slots else None

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
