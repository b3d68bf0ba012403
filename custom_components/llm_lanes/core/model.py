"""The engine's vocabulary: chat requests, their streamed answers, tool calls and token counts.

Independent of any server's API and of Home Assistant: the backends write these to the wire and
read them back (``backends/``), the gateway reads them from its clients and writes them back
(``protocols/``), and the scheduler queues, charges and relays them. It imports nothing of the
package, so every other module may import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


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
