"""A burst against a client's daily quota: it holds within one request (#21, item 1).

Thirty requests of about 270 prompt and 200 output tokens arrive at once from a client with a
2,000-token quota, through the OpenAI endpoint with the real ``openai`` client. Each request
reserves its prompt and output limit at admission, so the tokens served in the client's own lane
stay within the quota and one request, whether the rest are demoted to background or refused.
"""

from __future__ import annotations

import asyncio

from homeassistant.core import HomeAssistant
import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_QUOTA_ACTION
from custom_components.llm_lanes.core.lanes import Lane
from tests.support.entities import async_set_options
from tests.support.entries import MODEL
from tests.support.requests import finished_requests

from .conftest import Gateway

QUOTA = 2_000
BURST = 30
OUTPUT = 200
PROMPT = "Summarize the state of the house for the evening briefing. " * 18
"""About 270 tokens (four characters a token)."""


@pytest.mark.parametrize("action", ["demote", "reject"])
async def test_a_burst_stays_within_the_quota_and_one_request(
    hass: HomeAssistant,
    gateway: Gateway,
    init_integration: MockConfigEntry,
    action: str,
) -> None:
    """Of 30 requests sent at once, the client's lane serves at most its quota and one more."""
    await async_set_options(hass, init_integration, **{OPT_QUOTA_ACTION: action})
    client = await gateway.add_client(
        init_integration, name="Greedy", quota_tokens_per_day=QUOTA
    )
    finished = finished_requests(init_integration)
    api = gateway.openai(client.api_key)

    async def ask() -> str:
        try:
            await api.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=OUTPUT,
            )
        except openai.RateLimitError as err:
            return f"refused: {err.code}"
        return "served"

    outcomes = await asyncio.gather(*(ask() for _ in range(BURST)))
    mine = [record for record in finished if record.requester == client.requester]
    in_lane = [
        record
        for record in mine
        if record.lane is Lane.INTERACTIVE and record.outcome != "rejected"
    ]
    served = sum(record.prompt_tokens + record.output_tokens for record in in_lane)
    one_request = max(record.prompt_tokens for record in mine) + OUTPUT
    assert 0 < served <= QUOTA + one_request
    assert len(in_lane) < BURST
    if action == "demote":
        # The rest ran in background instead, every one of them answered.
        assert outcomes.count("served") == BURST
        assert all(r.lane is Lane.BACKGROUND for r in mine if r not in in_lane)
        assert all(r.outcome == "ok" for r in mine)
    else:
        assert outcomes.count("refused: quota_exceeded") == BURST - len(in_lane)
