"""The benchmark over several servers, its parts on virtual time: the direct baseline, power, checks.

The servers are the pool tests' machines (``tools/simulator/box.py``): the simulator's engine
behind a power switch, on a virtual-time loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from custom_components.llm_lanes.core.bench.runner import run_servers
from custom_components.llm_lanes.core.bench.servers import (
    START_LIMIT_S,
    BenchServer,
    Power,
    PowerSwitch,
    ServerDescription,
    ServerLostError,
    ServerTally,
)
from custom_components.llm_lanes.core.bench.targets import FAIL_TIMEOUT_S, Upstreams
from custom_components.llm_lanes.core.bench.workload import parse_scenario
from custom_components.llm_lanes.core.errors import BackendConnectionError
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings
from tests.core.boxes import now, request, run_virtual, words
from tools.simulator.box import Box

DESCRIPTION = ServerDescription(
    kind="llama_cpp", version="engine", model="engine", slots=4
)


def _server(
    name: str, box: Box, *, switched: bool = True, switch: PowerSwitch | None = None
) -> BenchServer:
    """Describe ``box`` as server ``name``, with ``switch`` or (``switched``) one that kills it."""

    async def kill() -> None:
        box.kill()

    async def start() -> None:
        box.power_on()

    if switch is None and switched:
        switch = PowerSwitch(kill=kill, start=start)
    return BenchServer(name=name, backend=box, description=DESCRIPTION, switch=switch)


def test_direct_over_two_servers_is_a_reverse_proxy_with_a_backup() -> None:
    """The first server while it answers; a refused one is skipped for 10 s; a broken stream fails."""

    async def main() -> None:
        one, two = Box("one"), Box("two")
        tallies = {"1": ServerTally(), "2": ServerTally()}
        upstreams = Upstreams(
            [_server("1", one), _server("2", two)], tallies, clock=now
        )

        async def answer(tokens: int = 4) -> str:
            stream = upstreams.stream(
                request(answer_tokens=tokens),
                lane=Lane.VOICE,
                requester="satellite.kitchen",
                prompt_tokens=2010,
            )
            return "".join([chunk.text async for chunk in stream])

        assert await answer() == words(0, 4)
        assert (len(one.requests), len(two.requests)) == (1, 0)
        assert one.requests[0].model == "engine"  # each server's own model
        one.kill()
        assert await answer() == words(
            0, 4
        )  # refused by the first, answered by the backup
        assert (tallies["1"].failovers_from, tallies["2"].failovers_to) == (1, 1)
        one.power_on()
        await asyncio.sleep(FAIL_TIMEOUT_S / 2)
        await answer()  # still skipped: straight to the backup
        assert (len(one.requests), len(two.requests)) == (1, 2)
        assert tallies["2"].failovers_to == 1
        await asyncio.sleep(FAIL_TIMEOUT_S)
        await answer()
        assert len(one.requests) == 2  # tried again once its fail timeout is over

        stream = upstreams.stream(
            request(answer_tokens=50),
            lane=Lane.BACKGROUND,
            requester="job.summary",
            prompt_tokens=2010,
        )
        first = await anext(stream)
        assert first.text == words(0, 1)
        one.kill()
        with pytest.raises(BackendConnectionError):
            async for _chunk in stream:
                pass
        assert len(two.requests) == 2  # a stream that began is not moved
        assert tallies["1"].served == {"voice": 2}
        assert tallies["2"].served == {"voice": 2}
        assert tallies["1"].failed_attempts == 2
        assert tallies["1"].output_tokens == 4 + 4 + 1

    run_virtual(main)


def test_power_switches_once_and_counts_the_time_off() -> None:
    """A second kill or start does nothing; the seconds off are counted; a wake waits its delay."""

    async def main() -> None:
        box = Box("one")
        calls: list[str] = []

        async def kill() -> None:
            calls.append("kill")
            box.kill()

        async def start() -> None:
            calls.append("start")
            box.power_on()

        server = _server("1", box, switch=PowerSwitch(kill=kill, start=start))
        tally = ServerTally()
        power = Power(server, tally, now=now, time_scale=1.0, wake_delay_s=5.0)
        await power.kill()
        await power.kill()
        await asyncio.sleep(10)
        await power.start()
        await power.start()
        assert calls == ["kill", "start"]
        assert (tally.kills, tally.starts, tally.off_s) == (1, 1, pytest.approx(10))
        await power.kill()
        woke_at = now()
        await power.wake()
        assert now() - woke_at == pytest.approx(5.0)
        assert tally.off_s == pytest.approx(15)
        tally.serve("voice")
        await power.kill()
        await power.restore()  # after a run: started, not counted
        assert (tally.starts, tally.served_since_start) == (2, 1)

    run_virtual(main)


def test_a_server_that_does_not_come_back() -> None:
    """A start it does not answer is logged and leaves it stopped; after a run it is an error."""

    async def main() -> None:
        box = Box("one")

        async def nothing() -> None:
            box.kill()

        server = _server("1", box, switch=PowerSwitch(kill=nothing, start=nothing))
        power = Power(server, ServerTally(), now=now, time_scale=1.0)
        await power.kill()
        started = now()
        await power.start()
        assert not power.running
        assert now() - started == pytest.approx(START_LIMIT_S, abs=0.5)
        with pytest.raises(ServerLostError, match=r"server 1 \(http://one.lan:8080\)"):
            await power.restore()
        with pytest.raises(ValueError, match="cannot stop or start server 2"):
            Power(_server("2", Box("two"), switched=False), ServerTally(), now=now, time_scale=1.0)  # fmt: skip

    run_virtual(main)


SCENARIO: dict[str, Any] = {
    "name": "pair",
    "duration_s": 10,
    "seed": 1,
    "classes": [
        {
            "name": "voice", "lane": "voice",
            "arrival": {"process": "poisson", "rate_per_s": 1},
            "prompt_tokens": {"mean": 100}, "output_tokens": {"mean": 10},
            "slo": {"ttft_s": 0.5, "itl_s": 0.1},
        }
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ({"asleep_at_start": [3]}, "the scenario names server 3, but only 2 servers are given"),
        ({"lane_servers": {"voice": [1, 4]}}, "names server 4"),
        ({"events": [{"at_s": 1, "server": 2, "action": "kill"}]}, "cannot stop or start server 2"),
    ],
)  # fmt: skip
def test_a_run_checks_its_servers_before_it_sends_anything(
    servers: dict[str, Any], message: str
) -> None:
    """Servers beyond those given, or one that cannot be stopped: refused, nothing sent."""

    async def main() -> None:
        one, two = Box("one"), Box("two")
        with pytest.raises(ValueError, match=message):
            await run_servers(
                [_server("1", one), _server("2", two, switched=False)],
                parse_scenario(SCENARIO | servers),
                policy="lanes",
                settings=[SchedulerSettings()] * 2,
            )
        assert one.requests == two.requests == []

    run_virtual(main)
