"""What a server's live load is, as any backend reports it (below the clients and their sources)."""

from __future__ import annotations

from dataclasses import dataclass


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
