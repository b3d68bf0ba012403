"""The data of ``llm_lanes_request_finished``: one event per request, of a server or of the pool."""

from __future__ import annotations

from typing import Any

from custom_components.llm_lanes.core.snapshot import FinishedRequest


def request_finished_event_data(
    entry_id: str | None, finished: FinishedRequest, *, pool: bool = False
) -> dict[str, Any]:
    """Build the data of ``llm_lanes_request_finished`` (never any prompt or answer text).

    ``server`` is the entry id of the server the request ended on (that of ``entry_id``, its
    scheduler's, unless the household's pool routed it: ``pool``; None when no server took it);
    ``failovers`` and ``resumed_on`` say how the pool moved it.
    """
    return {
        "config_entry_id": entry_id,
        "server": finished.server if pool else entry_id,
        "pool": pool,
        "failovers": finished.failovers,
        "resumed_on": finished.resumed_on,
        "request_id": finished.request_id,
        "lane": finished.lane.key,
        "requester": finished.requester,
        "outcome": finished.outcome,
        "error": finished.error,
        "queue_wait_s": finished.queue_wait_s,
        "ttft_s": finished.ttft_s,
        "itl_p95_s": finished.itl_p95_s,
        "e2e_s": finished.e2e_s,
        "prompt_tokens": finished.prompt_tokens,
        "output_tokens": finished.output_tokens,
        "token_source": finished.token_source,
        "preemptions": finished.preemptions,
        "met_ttft": finished.met_ttft,
        "met_itl": finished.met_itl,
        "met_objectives": finished.met_objectives,
    }
