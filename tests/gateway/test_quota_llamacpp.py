"""A burst against a client's quota in front of a real llama-server: it holds within one request.

Issue #25, item 1: a client with a 2,000-token daily quota sends 30 chats at once through the
OpenAI endpoint (the real ``openai`` client). Our estimate of each prompt is 9 tokens; the
server's chat template (Qwen 2.5's, which adds a default system prompt) makes it 34. Reserving
the estimate let 29 requests run in the client's lane: 2,774 tokens against the 2,096 promised.
A quota requester's prompt is now counted by the server before admission, so what the client's
lane serves stays within the quota and one request, and the quota is not left unused either.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.const import OPT_QUOTA_ACTION
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.tokens import estimate_text_tokens
from tests.support.entities import async_set_options
from tests.support.llamacpp import LlamaServer
from tests.support.requests import finished_requests

from .conftest import Gateway

pytestmark = pytest.mark.llamacpp

QUOTA = 2_000
BURST = 30
PROMPT = "Dim the hall lights."
"""Estimated at 9 tokens (four characters a token and four for the message)."""
PATIENCE_S = 300.0


@pytest.mark.parametrize("output", [60, 120])
@pytest.mark.parametrize("action", ["demote", "reject"])
async def test_a_burst_stays_within_the_quota_on_a_real_template(
    gateway: Gateway,
    llama_entry: MockConfigEntry,
    llama_server: LlamaServer,
    action: str,
    output: int,
) -> None:
    """Of 30 chats sent at once, the client's lane serves at most its quota and one more."""
    assert estimate_text_tokens(PROMPT) + 4 == 9
    await async_set_options(gateway.hass, llama_entry, **{OPT_QUOTA_ACTION: action})
    client = await gateway.add_client(
        llama_entry, name="Greedy", quota_tokens_per_day=QUOTA
    )
    finished = finished_requests(llama_entry)
    # The demoted chats queue behind each other in background on a CPU: a patient client.
    api = openai.AsyncOpenAI(
        base_url=gateway.openai_url,
        api_key=client.api_key,
        max_retries=0,
        timeout=PATIENCE_S,
    )

    async def ask() -> str:
        try:
            await api.chat.completions.create(
                model=llama_server.model_name,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=output,
                temperature=0,
            )
        except openai.RateLimitError as err:
            return f"refused: {err.code}"
        return "served"

    try:
        outcomes = await asyncio.gather(*(ask() for _ in range(BURST)))
    finally:
        await api.close()
    mine = [record for record in finished if record.requester == client.requester]
    ran = [record for record in mine if record.outcome != "rejected"]
    in_lane = [record for record in ran if record.lane is Lane.INTERACTIVE]
    # What the server charged, not our estimate: the template more than triples the prompt.
    assert {record.token_source for record in ran} == {"server"}
    prompt = max(record.prompt_tokens for record in ran)
    assert prompt > 3 * 9
    one_request = prompt + output
    served = sum(record.prompt_tokens + record.output_tokens for record in in_lane)
    assert served <= QUOTA + one_request, (served, len(in_lane))
    # Counted, not presumed: the quota's worth of requests ran in the lane.
    assert len(in_lane) >= QUOTA // one_request
    assert len(in_lane) < BURST
    if action == "demote":
        # The rest ran in background instead, every one of them answered.
        assert outcomes.count("served") == BURST
        assert all(
            record.lane is Lane.BACKGROUND for record in ran if record not in in_lane
        )
        assert all(record.outcome == "ok" for record in mine)
    else:
        assert outcomes.count("refused: quota_exceeded") == BURST - len(in_lane)
