"""The attempts of admitted requests: from the slot taken to the slot given back.

Each admitted attempt of a ticket takes its slot in the run state, is charged its prompt, is placed
on a server slot (``slots.SlotPlacer``), has a long background prompt prefilled in steps
(``prefill_steps.py``), and gets a *pump* task that reads the backend's stream,
charges each chunk and hands it to the caller through the ticket's channel. Preempting an attempt
cancels its pump (which closes the backend stream, cancelling it at the server) and requeues the
request at the head; its next attempt sends the kept text back as an assistant prefix.

Only the live attempt of a ticket (``Ticket.attempt_live``) may deliver: a cancelled pump, or one
whose request left, drops what it still reads. Whenever a slot or prefill budget frees, the
scheduler is asked to decide again (``dispatch``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
import contextlib
from dataclasses import dataclass, field
import logging

from custom_components.llm_lanes.core.accounting import Accounting
from custom_components.llm_lanes.core.backends.base import Backend
from custom_components.llm_lanes.core.errors import StreamClosedError
from custom_components.llm_lanes.core.model import ChatRequest, StreamChunk
from custom_components.llm_lanes.core.prefill_steps import PrefillSteps
from custom_components.llm_lanes.core.run_state import RunState
from custom_components.llm_lanes.core.slots import SlotPlacer
from custom_components.llm_lanes.core.ticket import Ticket

_LOGGER = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True, slots=True)
class Attempts:
    """Starts, streams, preempts and ends the attempts of one scheduler's requests."""

    backend: Backend
    state: RunState
    slots: SlotPlacer
    prefill: PrefillSteps
    accounting: Accounting
    clock: Callable[[], float]
    dispatch: Callable[[], None]
    """Decides again (called when a slot or the prefill budget frees)."""
    urgent_quiet: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no urgent lane is active: prompts prefilled in steps go on only then."""
    loop: asyncio.AbstractEventLoop | None = None
    """The event loop the pumps run on (set by the scheduler's first submission)."""
    pumps: set[asyncio.Task[None]] = field(default_factory=set)
    """The pumps not yet done."""

    def start(self, ticket: Ticket, now: float, rank: float) -> None:
        """Admit a request: take its slot, charge its prompt, start the pump for this attempt."""
        queued = ticket.queued
        self.state.start(queued, rank)
        ticket.attempts += 1
        ticket.attempt_live = ticket.attempts
        if ticket.admitted_at is None:
            ticket.admitted_at = now
        self.accounting.charge_prompt(ticket, now)
        request = ticket.next_attempt()
        if request is not None:
            request = self.slots.place(ticket, request, now)
        if request is None:
            # Preempted right after its last token: nothing is left to generate.
            self.state.release(queued)
            ticket.attempt_live = None
            final = StreamChunk(done=True, finish_reason="length")
            ticket.channel.put(self.accounting.settle(ticket, final))
            return
        assert self.loop is not None  # set by the first submission
        task = self.loop.create_task(
            self._pump(ticket, ticket.attempts, request),
            name=f"llm_lanes pump {queued.seq}",
        )
        ticket.pump = task
        self.pumps.add(task)
        task.add_done_callback(self.pumps.discard)

    def preempt(self, ticket: Ticket, now: float) -> None:
        """Cancel a background stream at the server, keep its output and requeue it at the head."""
        queued = ticket.queued
        self.state.release(queued)
        self.slots.free(ticket, now, cancelled=True)
        ticket.attempt_live = None
        if ticket.pump is not None:
            ticket.pump.cancel()
            ticket.pump = None
        self.accounting.count_preempted(ticket)
        queued.preemptions += 1
        ticket.requeued()
        self.state.requeue_front(queued, now)
        _LOGGER.debug(
            "preempted request %s after %s tokens", queued.seq, queued.output_tokens
        )

    def leave(self, ticket: Ticket, *, stop: bool) -> None:
        """Give back the queue place or the slot the request holds; no attempt may deliver now.

        With ``stop`` its pump is cancelled too (closing the stream at the server).
        """
        self.state.remove(ticket.queued)
        if self.state.release(ticket.queued):
            self.slots.free(ticket, self.clock(), cancelled=True)
        ticket.attempt_live = None
        if stop and ticket.pump is not None:
            ticket.pump.cancel()

    def _release_slot(self, ticket: Ticket) -> None:
        if self.state.release(ticket.queued):
            self.slots.free(ticket, self.clock(), cancelled=False)
            ticket.attempt_live = None
            self.dispatch()

    async def _pump(self, ticket: Ticket, attempt: int, request: ChatRequest) -> None:
        """Read one attempt's stream from the server into the caller's channel."""
        stream: AsyncGenerator[StreamChunk] | None = None
        accounting = self.accounting
        try:
            await self.slots.settled(request.slot, self.clock())
            if await self.prefill.run(ticket, request, self.state, self.urgent_quiet):
                await self.urgent_quiet.wait()
            iterator = self.backend.chat(request)
            if isinstance(iterator, AsyncGenerator):
                stream = iterator
            async for chunk in iterator:
                if ticket.attempt_live != attempt:
                    return
                prefilling = ticket.queued.prefilling
                accounting.charge_chunk(ticket, chunk, self.clock())
                if prefilling and not ticket.queued.prefilling and self.state.waiting:
                    self.dispatch()  # its prompt left the prefill budget
                if chunk.done:
                    final = accounting.settle(ticket, chunk)
                    self._release_slot(ticket)
                    ticket.channel.put(final)
                    return
                ticket.channel.put(chunk)
            if ticket.attempt_live == attempt:
                self._release_slot(ticket)
                ticket.channel.put(
                    StreamClosedError(
                        "the server closed the stream before it said it was done"
                    )
                )
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - handed to the caller, typed and unchanged
            if ticket.attempt_live == attempt:
                self._release_slot(ticket)
                ticket.channel.put(err)
        finally:
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()
