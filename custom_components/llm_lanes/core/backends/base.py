"""What every backend client provides, and what it reports of its server."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk

if TYPE_CHECKING:
    from custom_components.llm_lanes.core.backends.kinds import (
        ServerKind,
        ServerProfile,
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
    model_variants: Mapping[str, str] = field(default_factory=dict)
    """What exactly a model runs as, beyond its name, where the server says: its file (llama.cpp
    ``model_path``, vLLM's ``root``), its digest and quantization (Ollama), its quantization (LM
    Studio). Another variant under the same name is another model."""


@dataclass(frozen=True, slots=True)
class PrefillStep:
    """What one prefill step cost the server."""

    evaluated_tokens: int
    seconds: float


class Backend(ABC):
    """A client for one LLM server. Built with an aiohttp session that the caller owns."""

    profile: ServerProfile
    """What the server's kind is and can do (``core.backends.kinds``)."""
    base_url: str
    chooses_slots: bool = False
    """Whether requests may name the server slot they run on (``ChatRequest.slot``)."""
    prefills_in_steps: bool = False
    """Whether a prompt can be prefilled into a slot's cache in steps (``render_prompt`` and
    ``prefill``) before the request that uses it; turned off when the server refuses."""
    send_priority: bool = False
    """Whether requests carry the lane's ``priority``; turned off when the server refuses it."""
    counts_prompts: bool = False
    """Whether ``count_prompt_tokens`` asks the server (``ServerProfile.counts_prompts``);
    turned off when the server has no such endpoint."""

    def __init__(self, profile: ServerProfile) -> None:
        """Take the server's description; what requests may do starts as it says."""
        self.profile = profile
        self.chooses_slots = profile.chooses_slots
        self.prefills_in_steps = profile.prefills_in_steps
        self.send_priority = profile.takes_priority
        self.counts_prompts = profile.counts_prompts is not None

    @property
    def kind(self) -> ServerKind:
        """The server's kind (its description's id)."""
        return self.profile.kind

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

    async def count_prompt_tokens(self, request: ChatRequest) -> int | None:
        """Return the prompt tokens the server will charge ``request``, counted by the server.

        None where it cannot count (``counts_prompts``). Raises a ``BackendError`` when the
        count fails.
        """
        return None

    async def render_prompt(self, request: ChatRequest) -> str:
        """Return the prompt text the server's chat template makes of a request."""
        raise NotImplementedError

    async def prefill(self, model: str, text: str, slot: int) -> PrefillStep:
        """Evaluate ``text`` (the start of a rendered prompt) into a slot's prompt cache."""
        raise NotImplementedError

    async def busy_slots(self) -> frozenset[int] | None:
        """Return the slots processing a task now; None where the server does not say."""
        return None

    async def model_details(self, model: str) -> dict[str, Any] | None:
        """Return the server's own description of a model in Ollama's ``/api/show`` shape.

        None where the server has no such description (only Ollama has one).
        """
        return None
