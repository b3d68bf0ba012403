"""The simulated server without HTTP: a backend that serves from the simulator's engine in-process.

The engine (``tools/simulator/engine.py``) is the simulated server's continuous-batching model:
slots, a first-come-first-served queue, prefill and decode costs per iteration, a prompt cache per
slot. Here it answers the scheduler without HTTP, on the loop's clock (a ``VirtualTimeLoop`` makes
minutes of serving cost milliseconds), so the property suite (and ``scripts/bench --server engine``) can
run many mixed workloads against the costs of a real server. It plays llama.cpp (the client chooses the slot, prompts can be
prefilled in steps) or a server that places requests itself (``chooses_slots=False``).

A request's behaviour may travel in its ``options``: ``prompt_tokens`` (else its rendered text's
length, four characters a token; the server counts ``costs.tokens_per_estimate`` of its own for
each), ``answer_tokens`` (else ``max_tokens``, else 256), and ``fail``
(``"connect"``: fails before anything is sent back; an integer: fails after that many tokens).
Answers are the tokens ``w0 w1 w2 ...``, continued after an assistant prefix.
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
from custom_components.llm_lanes.core.errors import (
    BackendConnectionError,
    BackendHTTPError,
)
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk, TokenUsage
from tools.simulator.engine import Engine, EngineCosts, Sequence

CHARS_PER_TOKEN = 4
"""Rendered prompts are this many characters a token, so the engine's cache matching (a share of
the text) is a share of the tokens."""


def answer_text(start: int, count: int) -> str:
    """Return the answer's tokens ``start`` to ``start + count`` as the engine backend streams them."""
    return "".join(f"w{index} " for index in range(start, start + count))


def filler(tokens: int, seed: str) -> str:
    """Text of ``tokens`` tokens that no other seed shares a prefix with."""
    unit = f"{seed}|"
    return (unit * (tokens * CHARS_PER_TOKEN // len(unit) + 1))[
        : tokens * CHARS_PER_TOKEN
    ]


class EngineBackend(Backend):
    """Serve a scheduler from an in-process ``Engine`` (see the module docstring)."""

    base_url = "engine://in-process"

    def __init__(
        self,
        *,
        slots: int = 4,
        chooses_slots: bool = True,
        costs: EngineCosts | None = None,
        kv_capacity_tokens: int = 1 << 20,
        context_per_slot: int | None = None,
    ) -> None:
        """Make the engine; it starts with the first request (inside the running loop).

        ``context_per_slot``: the tokens one request may hold, as llama-server's ``n_ctx`` per
        slot (a longer prompt is refused with HTTP 400, an answer ends where the slot is full).
        """
        super().__init__(server_profile(ServerKind.LLAMA_CPP))
        self.chooses_slots = chooses_slots
        self.prefills_in_steps = chooses_slots
        loop = asyncio.get_running_loop()
        self.engine = Engine(
            slots=slots,
            kv_capacity_tokens=kv_capacity_tokens,
            prefill_chunk_tokens=None,
            costs=costs or EngineCosts(),
            clock=loop.time,
        )
        self.engine.start()
        self.slots = slots
        self.context_per_slot = context_per_slot
        self.prompts: list[tuple[ChatRequest, int]] = []
        """Every chat request and its prompt tokens, as the engine counted them."""
        self.in_flight: dict[int, Sequence] = {}
        """Sequences the engine holds for a caller now (chats and prefill steps)."""
        self.most_in_flight = 0
        self.served: list[tuple[float, ChatRequest, int]] = []
        """(time, request, output tokens before it) of every token streamed: the service given."""

    # --- what the scheduler asks ----------------------------------------------------------------

    async def server_info(self) -> ServerInfo:
        """Describe the engine as a llama.cpp server."""
        return ServerInfo(
            kind=self.kind,
            version="engine",
            models=("engine",),
            context_length=self.context_per_slot,
            slots=self.slots,
            unique_id="engine",
        )

    async def list_models(self) -> tuple[str, ...]:
        """Serve one model."""
        return ("engine",)

    async def metrics(self) -> ServerMetrics:
        """Report the sequences in flight."""
        return ServerMetrics(requests_running=len(self.engine.running))

    async def warm_up(self, model: str) -> bool:
        """Say the model is loaded: it always is."""
        return True

    async def busy_slots(self) -> frozenset[int]:
        """Return the slots holding a sequence now, as ``/slots`` says."""
        return frozenset(
            index
            for index, seq in enumerate(self.engine.slot_table())
            if seq is not None
        )

    async def render_prompt(self, request: ChatRequest) -> str:
        """Return the rendered prompt, as ``/apply-template`` gives it."""
        return self._render(request)

    async def prefill(self, model: str, text: str, slot: int) -> PrefillStep:
        """Evaluate the start of a prompt into a slot's cache (``n_predict`` 0)."""
        tokens = self._server_tokens(max(1, len(text) // CHARS_PER_TOKEN))
        seq = self.engine.submit(
            tokens, 0, prompt_text=text, slot=slot, prefill_only=True
        )
        self._track(seq)
        try:
            while await seq.tokens.get() is not None:
                pass
        finally:
            self.in_flight.pop(seq.id, None)
            self.engine.cancel(seq)
        evaluated = tokens - seq.cached_prompt_tokens
        # What llama-server's timings say (``prompt_ms``): the prefill, not the wait for it.
        return PrefillStep(
            evaluated_tokens=evaluated,
            seconds=self.engine.costs.pass_seconds(evaluated, 1, 0) / self.engine.speed,
        )

    def chat(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Stream the answer from the engine (closing the stream cancels it there)."""
        return self._chat(request)

    # --- the engine's side ------------------------------------------------------------------------

    def engine_time(self) -> float:
        """Return the time on the clock the engine runs on."""
        return asyncio.get_running_loop().time()

    def _render(self, request: ChatRequest) -> str:
        return "".join(f"<{m.role}>{m.content}" for m in request.messages) + (
            "<assistant>" + request.assistant_prefix
        )

    def _server_tokens(self, estimate: int) -> int:
        """Return what the server's tokenizer counts for ``estimate`` of our tokens."""
        return max(1, round(estimate * self.engine.costs.tokens_per_estimate))

    def _track(self, seq: Sequence) -> None:
        self.in_flight[seq.id] = seq
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))

    async def _chat(self, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
        options = request.options
        fail = options.get("fail")
        if fail == "connect":
            raise BackendConnectionError("the engine refused the connection")
        done_before = len(request.assistant_prefix.split())
        total = int(options.get("answer_tokens", request.max_tokens or 256))
        limit = request.max_tokens if request.max_tokens is not None else total
        count = max(0, min(limit, total - done_before))
        text = self._render(request)
        prompt = self._server_tokens(
            done_before
            + int(options.get("prompt_tokens", max(1, len(text) // CHARS_PER_TOKEN)))
        )
        self.prompts.append((request, prompt))
        if self.context_per_slot is not None:
            if prompt >= self.context_per_slot:
                raise BackendHTTPError(
                    f"the request exceeds the available context size ({prompt} tokens)",
                    status=400,
                )
            count = min(count, self.context_per_slot - prompt)
        seq = self.engine.submit(
            prompt,
            count,
            prompt_text=text,
            pieces=tuple(f"w{i} " for i in range(done_before, done_before + count)),
            slot=request.slot,
        )
        self._track(seq)
        sent = 0
        try:
            while (index := await seq.tokens.get()) is not None:
                if isinstance(fail, int) and sent >= fail:
                    raise BackendHTTPError("the engine failed mid-answer", status=500)
                sent += 1
                self.served.append((self.engine_time(), request, done_before + index))
                yield StreamChunk(text=f"w{done_before + index} ", output_tokens=1)
            if seq.cancelled:
                return
            yield StreamChunk(
                done=True,
                finish_reason="stop" if done_before + count >= total else "length",
                usage=TokenUsage(
                    prompt,
                    sent,
                    "server",
                    cached_prompt_tokens=seq.cached_prompt_tokens,
                ),
            )
        finally:
            self.in_flight.pop(seq.id, None)
            self.engine.cancel(seq)
