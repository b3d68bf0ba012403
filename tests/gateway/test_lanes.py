"""The lanes apply to clients: a voice client's request overtakes a background client's queue."""

from __future__ import annotations

import asyncio

from homeassistant.core import HomeAssistant
import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_MAX_SEQUENCES
from custom_components.llm_lanes.core.lanes import Lane
from tests.support.entities import async_set_options
from tests.support.entries import MODEL, REAL_SPEED_SIM
from tests.support.requests import async_wait_for, finished_requests

from .conftest import Gateway

pytestmark = pytest.mark.parametrize("sim_config", [REAL_SPEED_SIM], ids=["real_speed"])


async def _first_token(
    api: openai.AsyncOpenAI, label: str, order: list[str], tokens: int = 20
) -> None:
    stream = await api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Summarize {label}"}],
        stream=True,
        max_tokens=tokens,
        extra_body={"ignore_eos": True},
    )
    async for event in stream:
        if event.choices and event.choices[0].delta.content:
            if label not in order:
                order.append(label)


async def test_voice_client_overtakes_background_queue(
    hass: HomeAssistant, gateway: Gateway, init_integration: MockConfigEntry
) -> None:
    """With one sequence at a time, a voice client's request runs before queued background ones."""
    await async_set_options(hass, init_integration, **{OPT_MAX_SEQUENCES: 1})
    nightly = await gateway.add_client(
        init_integration, name="Batch", lane="background"
    )
    satellite = await gateway.add_client(
        init_integration, name="Satellite", lane="voice"
    )
    scheduler = init_integration.runtime_data.scheduler
    finished = finished_requests(init_integration)
    order: list[str] = []
    background = gateway.openai(nightly.api_key)

    # The first holds the one sequence for about 2 s (at the simulator's real pace) while the
    # others queue behind it: the queue forms long before it could end, whatever the load.
    tasks = [
        asyncio.create_task(_first_token(background, "batch 1", order, tokens=200))
    ]
    await async_wait_for(lambda: order == ["batch 1"])
    tasks += [
        asyncio.create_task(_first_token(background, f"batch {n}", order))
        for n in (2, 3)
    ]
    await async_wait_for(
        lambda: scheduler.snapshot().lanes[Lane.BACKGROUND].queue_depth == 2
    )
    tasks.append(
        asyncio.create_task(
            _first_token(gateway.openai(satellite.api_key), "voice", order)
        )
    )
    await asyncio.gather(*tasks)

    assert order == ["batch 1", "voice", "batch 2", "batch 3"]
    lanes = {f.requester: f.lane for f in finished}
    assert lanes == {
        nightly.requester: Lane.BACKGROUND,
        satellite.requester: Lane.VOICE,
    }
    assert all(f.outcome == "ok" for f in finished)
