"""What callers send cannot grow the entity registry, the scheduler or the job store without end.

Ten thousand ``generate`` and ``summarize`` calls, by an automation, an admin and a non-admin, each
with a random requester (and jobs with random names): the token sensors, the requesters the
scheduler counts, the named requesters the server keeps and the stored jobs all stay under their
caps. ``generate`` is refused at the door (its lane's queue holds none) after the requester is
resolved, so the calls are fast and still reach the scheduler's accounting; jobs are paused.
"""

from __future__ import annotations

import random
import string
from typing import Any

from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import ServiceValidationError
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.jobs.queue import MAX_WAITING_JOBS
from custom_components.llm_lanes.jobs.store import storage_key
from custom_components.llm_lanes.requesters import (
    MAX_NAMED_REQUESTERS,
    REQUESTER_TOKENS_KEY,
)

from .support.entities import (
    async_call_entity_action,
    async_flush_snapshots,
    async_set_options,
)

CALLS = 10_000
FIXED_REQUESTERS = 5
"""``other``, ``job``, ``generate`` and the two users: there whatever the callers send."""
ID_CHARACTERS = string.ascii_letters + string.digits + "_.:@-"


def _random_requester(rng: random.Random) -> str:
    kind = rng.choice(["", "job:", "client:", "user:", "device:", "automation:"])
    return kind + "".join(rng.choices(ID_CHARACTERS, k=rng.randint(1, 40)))


async def test_ten_thousand_random_requesters_stay_bounded(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_admin_user: MockUser,
    hass_read_only_user: MockUser,
    hass_storage: dict[str, Any],
) -> None:
    """Sensors, counted requesters, kept names and stored jobs stay under their caps."""
    entry = init_integration
    await async_call_entity_action(hass, entry, "switch", "jobs_paused", "turn_on")
    await async_set_options(hass, entry, automation={"max_queued": 0})
    rng = random.Random(12)
    contexts = [
        Context(),
        Context(user_id=hass_admin_user.id),
        Context(user_id=hass_read_only_user.id),
    ]
    refused = 0
    for call in range(CALLS):
        requester = _random_requester(rng)
        data: dict[str, Any] = {"requester": requester}
        if call % 2:
            action = "generate"
            data |= {"config_entry_id": entry.entry_id, "prompt": "Hi"}
        else:
            action = "summarize"
            data |= {"text": "The lights are on.", "name": requester[-20:]}
        try:
            await hass.services.async_call(
                DOMAIN,
                action,
                data,
                blocking=True,
                return_response=True,
                context=rng.choice(contexts),
            )
        except ServiceValidationError:
            refused += 1
    await async_flush_snapshots(hass)

    runtime = entry.runtime_data
    bound = MAX_NAMED_REQUESTERS + FIXED_REQUESTERS
    counted = runtime.scheduler.snapshot().requesters
    assert len(counted) <= bound
    assert runtime.requesters.named_count <= MAX_NAMED_REQUESTERS
    sensors = [
        registry_entry
        for registry_entry in er.async_entries_for_config_entry(
            er.async_get(hass), entry.entry_id
        )
        if REQUESTER_TOKENS_KEY in registry_entry.unique_id
    ]
    assert len(sensors) == len(counted) <= bound
    stored = hass_storage[storage_key(entry.entry_id)]["data"]["jobs"]
    assert len(stored) == len(runtime.jobs.jobs()) == MAX_WAITING_JOBS
    assert refused == CALLS - MAX_WAITING_JOBS
    assert "other" in counted
