"""What every backend client provides, and the data that flows through the scheduler."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal
from urllib.parse import urlsplit


class ServerKind(StrEnum):
    """The kind of LLM server behind a base URL."""

    OLLAMA = "ollama"
    LLAMA_CPP = "llama_cpp"
    VLLM = "vllm"
    LM_STUDIO = "lm_studio"
    LOCALAI = "localai"
    OPENAI_COMPATIBLE = "openai_compatible"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call of a tool the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model (JSON-schema parameters)."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a conversation."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    """For ``role == "tool"``: the call this message answers."""
    name: str | None = None
    """For ``role == "tool"``: the tool's name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """A chat completion request, independent of the server's API."""

    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    json_schema: dict[str, Any] | None = None
    """Ask for structured output that matches this schema."""
    json_mode: bool = False
    """Ask for a JSON object without a schema (OpenAI ``json_object``, Ollama ``format: "json"``);
    ``json_schema`` wins when both are set."""
    assistant_prefix: str = ""
    """Resume after preemption: the answer so far, sent back as the final assistant message so
    the server continues it. Chunks then carry only the new text."""
    priority: int | None = None
    """Server-side priority (vLLM ``--scheduling-policy priority``; lower runs first)."""
    slot: int | None = None
    """The server slot to run on, chosen by the scheduler where the server lets clients choose
    (llama.cpp's ``id_slot``); the slot keeps the prompt in its cache for the next request."""
    options: dict[str, Any] = field(default_factory=dict)
    """Extra server-specific sampling options, passed through."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest(ChatRequest):
    """A raw text completion: ``prompt`` continued as it is, without the chat template.

    The scheduler runs it as it runs a chat (``Backend.chat`` takes it); ``messages`` stays
    empty, and an attempt resumed after a preemption continues ``prompt + assistant_prefix``.
    """

    prompt: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddingRequest(ChatRequest):
    """The embeddings of ``inputs``; ``messages`` stays empty.

    Its answer is one chunk carrying the vectors (counted as the answer's first token, so the
    request has a time to first token), then the final chunk with the prompt's token count.
    """

    inputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Token counts of one request and where they came from."""

    prompt_tokens: int
    output_tokens: int
    source: Literal["server", "estimate"]
    cached_prompt_tokens: int | None = None
    """Prompt tokens the server took from its prompt cache instead of evaluating them (llama.cpp
    ``timings.cache_n``, vLLM ``prompt_tokens_details.cached_tokens``); None where it does not say."""
    evaluated_prompt_tokens: int | None = None
    """Prompt tokens the server evaluated, over every attempt of a request that was preempted and
    resumed (its resumptions' prompts included); None: ``prompt_tokens`` minus the cached ones."""

    @property
    def prompt_tokens_evaluated(self) -> int:
        """Prompt tokens the server evaluated (all of them where it reports no cache use)."""
        if self.evaluated_prompt_tokens is not None:
            return self.evaluated_prompt_tokens
        return self.prompt_tokens - (self.cached_prompt_tokens or 0)


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """A piece of a streamed answer.

    The last chunk has ``done=True``, a ``finish_reason`` ("stop", "length", "tool_calls", ...) and
    ``usage``. ``output_tokens`` is how many tokens this chunk carries (1 for most servers' deltas;
    0 for chunks without text).
    """

    text: str = ""
    output_tokens: int = 0
    tool_calls: tuple[ToolCall, ...] = ()
    done: bool = False
    finish_reason: str | None = None
    usage: TokenUsage | None = None
    embeddings: tuple[Sequence[float], ...] = ()
    """The vectors of an ``EmbeddingRequest``, one per input."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """A whole answer, gathered from its stream chunks."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: TokenUsage | None = None

    @classmethod
    def of(cls, chunks: Iterable[StreamChunk]) -> Answer:
        """Join the chunks' text and tool calls; the final chunk gives reason and usage."""
        parts: list[str] = []
        tool_calls: list[ToolCall] = []
        finish_reason: str | None = None
        usage: TokenUsage | None = None
        for chunk in chunks:
            parts.append(chunk.text)
            tool_calls.extend(chunk.tool_calls)
            if chunk.done:
                finish_reason = chunk.finish_reason
                usage = chunk.usage
        return cls(
            text="".join(parts),
            tool_calls=tuple(tool_calls),
            finish_reason=finish_reason,
            usage=usage,
        )


def server_unique_id(kind: ServerKind, base_url: str) -> str:
    """Identity of a server that reports none of its own: its kind, host, port and path."""
    parts = urlsplit(base_url)
    return (
        f"{kind.value}@{(parts.hostname or '').lower()}:{parts.port or ''}{parts.path}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerInfo:
    """What the device shows about the server."""

    kind: ServerKind
    version: str | None
    models: tuple[str, ...]
    loaded_models: tuple[str, ...] = ()
    context_length: int | None = None
    slots: int | None = None
    metrics_enabled: bool = False
    unique_id: str
    """Stable identity of the server (used as the config entry's unique id)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerMetrics:
    """Live load of the server, from whatever it exposes (None where it says nothing)."""

    requests_running: int | None = None
    requests_waiting: int | None = None
    kv_cache_usage: float | None = None
    """Fraction 0..1 of the KV cache in use."""
    preemptions: int | None = None
    slots_total: int | None = None
    slots_busy: int | None = None
    loaded_models: tuple[str, ...] = ()
    prompt_tokens_total: int | None = None
    output_tokens_total: int | None = None


@dataclass(frozen=True, slots=True)
class PrefillStep:
    """What one prefill step cost the server."""

    evaluated_tokens: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendTimeouts:
    """How long a backend waits for the server before it gives up with a typed error."""

    connect_s: float = 10.0
    """Opening the TCP connection."""
    request_s: float = 30.0
    """A whole non-streaming call (server info, models, metrics)."""
    first_token_s: float = 120.0
    """From sending a chat request to its first streamed line (covers a cold model load)."""
    idle_s: float = 60.0
    """The longest silence between two streamed lines once the stream has started."""
    warm_up_s: float = 300.0
    """Loading a model into memory."""


class Backend(ABC):
    """A client for one LLM server. Built with an aiohttp session that the caller owns."""

    kind: ServerKind
    base_url: str
    chooses_slots: bool = False
    """Whether requests may name the server slot they run on (``ChatRequest.slot``)."""
    prefills_in_steps: bool = False
    """Whether a prompt can be prefilled into a slot's cache in steps (``render_prompt`` and
    ``prefill``) before the request that uses it; turned off when the server refuses."""

    @abstractmethod
    async def server_info(self) -> ServerInfo:
        """Ask the server what it is and what it serves."""

    @abstractmethod
    async def list_models(self) -> tuple[str, ...]:
        """Models the server can serve."""

    @abstractmethod
    def chat(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Stream an answer: to a chat, a raw completion or embeddings (by the request's type).

        Closing the iterator early (``aclose``) cancels the request at the server and frees its
        slot. Raises a ``BackendError`` subclass on failure, never hangs.
        """

    @abstractmethod
    async def metrics(self) -> ServerMetrics:
        """Read the server's live load (slots, KV cache, queue)."""

    @abstractmethod
    async def warm_up(self, model: str) -> bool:
        """Load the model and keep it resident; return whether it is loaded now."""

    async def render_prompt(self, request: ChatRequest) -> str:
        """Return the prompt text the server's chat template makes of a request."""
        raise NotImplementedError

    async def prefill(self, model: str, text: str, slot: int) -> PrefillStep:
        """Evaluate ``text`` (the start of a rendered prompt) into a slot's prompt cache."""
        raise NotImplementedError

    async def model_details(self, model: str) -> dict[str, Any] | None:
        """Return the server's own description of a model in Ollama's ``/api/show`` shape.

        None where the server has no such description (only Ollama has one).
        """
        return None
