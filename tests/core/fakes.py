"""A fake clock and a deterministic fake LLM server for the scheduler tests.

The fake backend plays the server: it answers with numbered tokens ("t0 t1 ..."), continues after an
assistant prefix the way a server does after preemption, and records what the server side saw
(concurrent streams, prompt tokens in flight, cancellations). Time advances only when it says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field

from custom_components.llm_lanes.core.backends.base import Backend, ServerInfo
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.core.errors import BackendHTTPError
from custom_components.llm_lanes.core.model import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    TokenUsage,
)


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        """Start at an arbitrary non-zero time."""
        self.now = start

    def __call__(self) -> float:
        """Return the current fake time."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


@dataclass
class ServerStream:
    """What the fake server saw of one stream."""

    request: ChatRequest
    prompt_tokens: int
    tokens_sent: int = 0
    closed_early: bool = False
    finished: bool = False


def chat(
    *,
    answer_tokens: int = 5,
    prompt_tokens: int | None = None,
    gate: asyncio.Event | None = None,
    fail_after: int | None = None,
    tag: str = "",
    max_tokens: int | None = None,
) -> ChatRequest:
    """Build a request the fake server understands (its behaviour travels in ``options``)."""
    options: dict[str, object] = {"answer_tokens": answer_tokens, "tag": tag}
    if prompt_tokens is not None:
        options["prompt_tokens"] = prompt_tokens
    if gate is not None:
        options["gate"] = gate
    if fail_after is not None:
        options["fail_after"] = fail_after
    return ChatRequest(
        model="fake",
        messages=(ChatMessage(role="user", content="hello there"),),
        max_tokens=max_tokens,
        options=options,
    )


@dataclass
class FakeBackend(Backend):
    """A deterministic server: each token advances the clock by ``token_s`` and yields once."""

    clock: FakeClock
    token_s: float = 0.01
    prefill_s: float = 0.0
    on_start: Callable[[ServerStream], None] | None = None
    on_token: Callable[[ServerStream], None] | None = None
    streams: list[ServerStream] = field(default_factory=list)
    active: list[ServerStream] = field(default_factory=list)
    max_active: int = 0
    kind: ServerKind = ServerKind.OLLAMA
    chooses_slots: bool = False
    counts_prompts: bool = False
    counted: list[ChatRequest] = field(default_factory=list)
    """The requests whose prompt it was asked to count."""
    count_error: Exception | None = None

    async def server_info(self) -> ServerInfo:
        """Describe the fake server."""
        return ServerInfo(
            kind=self.kind, version="0", models=("fake",), unique_id="fake"
        )

    async def list_models(self) -> tuple[str, ...]:
        """Serve one model."""
        return ("fake",)

    async def metrics(self) -> ServerMetrics:
        """Report the streams in flight."""
        return ServerMetrics(requests_running=len(self.active))

    async def warm_up(self, model: str) -> bool:
        """Pretend the model is loaded."""
        return True

    async def busy_slots(self) -> frozenset[int] | None:
        """Report the slots of the streams in flight (a closed stream leaves at once)."""
        if not self.chooses_slots:
            return None
        return frozenset(
            slot for stream in self.active if (slot := stream.request.slot) is not None
        )

    async def count_prompt_tokens(self, request: ChatRequest) -> int | None:
        """Count the prompt as ``chat`` will report it (where ``counts_prompts``)."""
        if not self.counts_prompts:
            return None
        self.counted.append(request)
        await asyncio.sleep(0)  # a round trip
        if self.count_error is not None:
            raise self.count_error
        return _server_prompt(request)

    def chat(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Stream numbered tokens, continuing after any assistant prefix."""
        return self._chat(request)

    async def _chat(self, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
        options = request.options
        done_before = len(request.assistant_prefix.split())
        prompt = _server_prompt(request)
        stream = ServerStream(request=request, prompt_tokens=prompt)
        self.streams.append(stream)
        self.active.append(stream)
        self.max_active = max(self.max_active, len(self.active))
        if self.on_start is not None:
            self.on_start(stream)
        gate = options.get("gate")
        fail_after = options.get("fail_after")
        total = int(options.get("answer_tokens", 5))
        limit = request.max_tokens if request.max_tokens is not None else total
        count = max(0, min(limit, total - done_before))
        try:
            if self.prefill_s:
                self.clock.advance(self.prefill_s)
            for index in range(done_before, done_before + count):
                if isinstance(gate, asyncio.Event):
                    await gate.wait()
                await asyncio.sleep(0)
                if fail_after is not None and stream.tokens_sent >= int(fail_after):
                    raise BackendHTTPError("boom", status=500)
                self.clock.advance(self.token_s)
                stream.tokens_sent += 1
                if self.on_token is not None:
                    self.on_token(stream)
                yield StreamChunk(text=f"t{index} ", output_tokens=1)
            await asyncio.sleep(0)
            stream.finished = True
            yield StreamChunk(
                done=True,
                finish_reason="stop" if done_before + count >= total else "length",
                usage=TokenUsage(prompt, count, "server"),
            )
        finally:
            if not stream.finished:
                stream.closed_early = True
            self.active.remove(stream)


def _server_prompt(request: ChatRequest) -> int:
    """Return the prompt tokens the fake server charges (``prompt_tokens``; 10 unless told)."""
    done_before = len(request.assistant_prefix.split())
    return int(request.options.get("prompt_tokens", 10)) + done_before


def served_tags(backend: FakeBackend) -> list[str]:
    """Return the ``tag`` of each request the fake server was sent, in the order it started them."""
    return [str(stream.request.options["tag"]) for stream in backend.streams]


def expected_text(tokens: int) -> str:
    """Return the whole answer of ``tokens`` tokens that the fake server gives."""
    return "".join(f"t{index} " for index in range(tokens))


async def settle(rounds: int = 20) -> None:
    """Let the event loop run pending work."""
    for _ in range(rounds):
        await asyncio.sleep(0)
