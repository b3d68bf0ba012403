"""What a request is charged for the service it gets, as it gets it.

Prompt tokens are charged when an attempt is admitted, output tokens as they stream, and both are
reconciled with the server's own counts when the answer is done. A charge goes to the requester's
Virtual Token Counter (weighted: ``input_weight`` per prompt token, ``output_weight`` per output
token), to the background share's ledger, and to the lane's and the requester's metrics. When the
request leaves, its tokens count against the requester's daily quota (if it was admitted) and its
record joins the sliding-window statistics.

Charging a streamed token is on the hot path: a few additions, no allocation but the gap sample.
"""

from __future__ import annotations

from dataclasses import replace

from custom_components.llm_lanes.core.batch_cost import BatchCostModel
from custom_components.llm_lanes.core.errors import QueueTimeoutError
from custom_components.llm_lanes.core.metrics import GroupStats
from custom_components.llm_lanes.core.model import StreamChunk, TokenUsage
from custom_components.llm_lanes.core.quotas import QuotaLedger
from custom_components.llm_lanes.core.run_state import RunState
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from custom_components.llm_lanes.core.ticket import Ticket

REQUESTER_MAX_SAMPLES = 1_000
"""Samples kept per requester and window (lanes keep more), so snapshots stay cheap with many."""


class Accounting:
    """Charges requests on their tickets, the ledgers and the statistics of one server."""

    __slots__ = (
        "_cost_model",
        "_state",
        "_window_s",
        "lane_stats",
        "quotas",
        "requester_stats",
        "share",
    )

    def __init__(
        self,
        state: RunState,
        *,
        window_s: float,
        cost_model: BatchCostModel | None = None,
    ) -> None:
        """Charge with the weights of ``state``'s settings, into its share ledger.

        With ``cost_model``, every gap also teaches the model how the sequences in flight slow
        the tokens.
        """
        self.share = state.share
        self._state = state
        self._cost_model = cost_model
        self.quotas = QuotaLedger()
        """Tokens per requester over the last 24 hours."""
        self.lane_stats = {lane: GroupStats() for lane in state.lanes}
        self.requester_stats: dict[str, GroupStats] = {}
        self._window_s = window_s

    def stats_of(self, requester: str) -> GroupStats:
        """Return a requester's statistics (created at its first request)."""
        stats = self.requester_stats.get(requester)
        if stats is None:
            stats = self.requester_stats[requester] = GroupStats(REQUESTER_MAX_SAMPLES)
        return stats

    def charge_prompt(self, ticket: Ticket, now: float) -> None:
        """Charge the prompt of an attempt being admitted.

        The fairness counter and the share are charged a request's prompt once: a resumed
        attempt's prompt is that prompt again and the output already charged, so charging it
        again would count a preemption as service.
        """
        queued = ticket.queued
        tokens = queued.prompt_tokens
        ticket.attempt_prompt = tokens
        ticket.attempt_output = 0
        if ticket.preemptions == 0:
            weight = self._state.settings.input_weight * tokens
            ticket.counters[queued.requester] += weight
            self.share.add(now, weight, background=queued.lane.yields)
        ticket.lane_stats.prompt_rate.add(now, tokens, self._window_s)
        ticket.requester_stats.prompt_rate.add(now, tokens, self._window_s)

    def charge_chunk(self, ticket: Ticket, chunk: StreamChunk, now: float) -> None:
        """Charge one streamed chunk: fairness counter, background share, rates, gaps."""
        tokens = chunk.output_tokens
        if tokens:
            queued = ticket.queued
            queued.output_tokens += tokens
            ticket.attempt_output += tokens
            weight = tokens * self._state.settings.output_weight
            ticket.counters[queued.requester] += weight
            self.share.add(now, weight, background=queued.lane.yields)
            ticket.lane_stats.output_rate.add(now, tokens, self._window_s)
            ticket.requester_stats.output_rate.add(now, tokens, self._window_s)
        if tokens or chunk.text or chunk.tool_calls:
            self._state.prefill_done(ticket.queued)
            last = ticket.last_token_at
            decoding = self._state.decoding_alone()
            if last is None:
                ticket.first_token_at = now
            else:
                gap = now - last
                ticket.gaps.append(gap)
                ticket.lane_stats.itl.add(now, gap)
                ticket.requester_stats.itl.add(now, gap)
                # Only a gap whose batch was the same at both ends (one that changed in
                # between mixes two batch sizes) and that spans no task launch (a launch may
                # stall the server's loop: its prompt-cache copies, a template, a sampled token).
                if (
                    self._cost_model is not None
                    and decoding
                    and decoding == ticket.batch_at_last_token
                    and self._state.launches == ticket.launches_at_last_token
                ):
                    self._cost_model.observe(decoding, gap)
            ticket.batch_at_last_token = decoding
            ticket.launches_at_last_token = self._state.launches
            ticket.last_token_at = now
        if chunk.text:
            ticket.parts.append(chunk.text)

    def settle(self, ticket: Ticket, chunk: StreamChunk) -> StreamChunk:
        """Reconcile the estimates with the server's usage; give the final chunk whole-request usage."""
        usage = chunk.usage
        if usage is not None and usage.source == "server":
            # A resumed attempt's prompt was not charged (see charge_prompt).
            adjust_prompt = (
                usage.prompt_tokens - ticket.attempt_prompt
                if ticket.preemptions == 0
                else 0
            )
            adjust_output = usage.output_tokens - ticket.attempt_output
            ticket.output_adjust += adjust_output
            settings = self._state.settings
            correction = (
                settings.input_weight * adjust_prompt
                + settings.output_weight * adjust_output
            )
            if correction:
                ticket.counters[ticket.queued.requester] += correction
            ticket.token_source = "server"
            if ticket.preemptions == 0:
                ticket.usage_prompt = usage.prompt_tokens
        if usage is not None and ticket.preemptions == 0:
            return chunk
        cached = evaluated = None
        if usage is not None and usage.cached_prompt_tokens is not None:
            cached = ticket.cached_prompt + usage.cached_prompt_tokens
            evaluated = ticket.evaluated_prompt + usage.prompt_tokens_evaluated
        return replace(
            chunk,
            usage=TokenUsage(
                ticket.prompt_tokens,
                ticket.output_tokens,
                "server" if ticket.token_source == "server" else "estimate",
                cached_prompt_tokens=cached,
                evaluated_prompt_tokens=evaluated,
            ),
        )

    def charge_finished(
        self, ticket: Ticket, record: FinishedRequest, now: float
    ) -> None:
        """Count a request that left: its quota use (if admitted) and its statistics."""
        admitted = ticket.admitted_at is not None
        self.quotas.release(record.requester, ticket.reserved)
        ticket.reserved = 0
        if admitted:
            prompt = record.prompt_tokens
            if ticket.usage_prompt is None and ticket.counted_prompt is not None:
                prompt = (
                    ticket.counted_prompt
                )  # no report (cancelled): the server's count
            self.quotas.charge(record.requester, prompt + record.output_tokens, now)
        timed_out = record.error == QueueTimeoutError.__name__
        for stats in (ticket.lane_stats, ticket.requester_stats):
            stats.record_finished(
                now,
                counts_for_goodput=record.outcome in {"ok", "error"},
                good=record.met_objectives,
                queue_wait_s=record.queue_wait_s,
                ttft_s=record.ttft_s,
                e2e_s=record.e2e_s,
                prompt_tokens=record.prompt_tokens if admitted else 0,
                output_tokens=record.output_tokens,
            )
            if timed_out:
                stats.rejected_total += 1

    @staticmethod
    def count_rejected(ticket: Ticket) -> None:
        """Count a request refused at the door."""
        ticket.lane_stats.rejected_total += 1
        ticket.requester_stats.rejected_total += 1

    @staticmethod
    def count_preempted(ticket: Ticket) -> None:
        """Count a preemption of the request (and the prompt its stopped attempt evaluated).

        A stopped attempt reports no usage: if it got past its prompt, the server evaluated that
        prompt (an estimate: part of it may have come from the cache).
        """
        if ticket.attempt_output:
            ticket.evaluated_prompt += ticket.attempt_prompt
        ticket.preemptions += 1
        ticket.lane_stats.preemptions_total += 1
        ticket.requester_stats.preemptions_total += 1
