"""The simulated machine reports its slots as llama-server's ``/slots`` does.

The scheduler learns how long a cancelled slot stays busy from these reports (``slots.py``:
``SlotPlacer.settled``); a box that did not pass them on left the benchmark's engine runs
without that measurement, and voice waited out every cancellation there.
"""

from __future__ import annotations

from .boxes import Box, request, run_virtual


def test_a_box_reports_the_slot_a_stream_holds() -> None:
    """Busy while it streams, free once it ended; a box whose server picks slots says nothing."""

    async def main() -> tuple[object, ...]:
        box = Box("gpu", slots=2)
        idle = await box.busy_slots()
        stream = box.chat(request(answer_tokens=40, slot=1))
        await anext(stream)
        streaming = await box.busy_slots()
        async for _ in stream:
            pass
        done = await box.busy_slots()
        blind = await Box("ollama", chooses_slots=False).busy_slots()
        return idle, streaming, done, blind

    idle, streaming, done, blind = run_virtual(main)
    assert idle == frozenset()
    assert streaming == frozenset({1})
    assert done == frozenset()
    assert blind is None
