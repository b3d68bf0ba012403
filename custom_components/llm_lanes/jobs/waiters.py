"""Who is told when a job finishes: the callers of ``JobManager.async_wait``.

``JobWaiters`` hands a job, as it is when it finishes (or when it starts a long wait, to the
callers that asked for that), to the callers waiting for it. (The entities are called back
through the manager's ``listeners.Listeners``.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from homeassistant.core import HomeAssistant, callback

from custom_components.llm_lanes.jobs.model import Job


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Job]
    answer_long_waits: bool


class JobWaiters:
    """The callers waiting for jobs to finish (or, if they asked, to wait long)."""

    def __init__(self, hass: HomeAssistant) -> None:
        """Start with no one waiting."""
        self._hass = hass
        self._waiters: dict[str, list[_Waiter]] = {}

    async def async_wait(
        self, job: Job, timeout: float, *, answer_long_waits: bool
    ) -> Job:
        """Wait until ``answer`` hands the job over, or ``timeout`` seconds; return it then."""
        waiter = _Waiter(self._hass.loop.create_future(), answer_long_waits)
        self._waiters.setdefault(job.id, []).append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            return job
        finally:
            waiters = self._waiters.get(job.id, [])
            if waiter in waiters:
                waiters.remove(waiter)

    @callback
    def answer(self, job: Job, *, finished: bool = True) -> None:
        """Hand the job, as it is now, to the callers waiting for this.

        ``finished``: the job finished (every caller is answered); else it waits long (only the
        callers that asked for long waits are).
        """
        waiters = self._waiters.pop(job.id, [])
        for waiter in waiters:
            if (finished or waiter.answer_long_waits) and not waiter.future.done():
                waiter.future.set_result(job)
        if kept := [waiter for waiter in waiters if not waiter.future.done()]:
            self._waiters[job.id] = kept

    @callback
    def cancel_all(self) -> None:
        """Stop every wait (the manager stops)."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.cancel()
        self._waiters.clear()
