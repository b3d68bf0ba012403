"""``scripts/bench run`` against the gateway: both endpoints are detected and serve a scenario.

The detection of ``core.backends.detect`` needs nothing of its own: the OpenAI endpoint answers
``/v1/models`` (a generic OpenAI-compatible server), the Ollama endpoint ``/api/version`` and
``/api/tags``.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.llm_lanes.core.backends.detect import connect
from custom_components.llm_lanes.core.backends.kinds import ServerKind
from custom_components.llm_lanes.core.lanes import Lane
from tests.support.entries import MODEL
from tests.support.requests import finished_requests
from tools.bench.__main__ import _run, build_parser
from tools.simulator.server import SimConfig

from .conftest import Gateway

SHORT_ANSWERS = {
    "name": "short_answers", "duration_s": 3, "warmup_s": 0.5, "seed": 5,
    "classes": [
        {
            "name": "chats", "lane": "interactive", "requesters": ["u1", "u2"],
            "arrival": {"process": "closed", "concurrency": 2},
            "prompt_tokens": {"mean": 100, "std": 10, "min": 80, "max": 120},
            "output_tokens": {"mean": 8, "std": 0, "min": 8, "max": 8},
            "slo": {"ttft_s": 10, "itl_s": 1},
        },
    ],
}  # fmt: skip


@pytest.fixture
def sim_config() -> SimConfig:
    """One fast simulated llama.cpp behind the gateway."""
    return SimConfig(slots=4, speed=50.0)


async def test_bench_runs_against_both_endpoints(
    gateway: Gateway, init_integration: MockConfigEntry, tmp_path: Path
) -> None:
    """Detection finds an OpenAI-compatible and an Ollama server; a short run has no errors."""
    client = await gateway.add_client(init_integration, name="Benchmark")
    targets = {
        ServerKind.OPENAI_COMPATIBLE: (
            gateway.openai_url,
            ["--api-key", client.api_key],
        ),
        ServerKind.OLLAMA: (gateway.ollama_url(client.api_key), []),
    }
    async with aiohttp.ClientSession() as session:
        for kind, (url, key) in targets.items():
            backend = await connect(session, url, api_key=key[1] if key else None)
            assert backend.kind is kind
            assert (await backend.server_info()).models == (MODEL,)

    # Short answers: tens of requests in the run's 3 s even on a loaded machine (the built-in
    # scenarios' 400-token summaries finished a handful there).
    scenario = tmp_path / "short.json"
    scenario.write_text(json.dumps(SHORT_ANSWERS))
    for kind, (url, key) in targets.items():
        out = tmp_path / kind.value
        args = build_parser().parse_args(
            ["run", "--server", url, *key, "--scenario", str(scenario), "--duration", "3",
             "--policy", "direct", "--no-plots", "--out", str(out)]
        )  # fmt: skip
        finished = finished_requests(init_integration)
        assert await _run(args) == 0
        classes = json.loads((out / "report.json").read_text())["classes"].values()
        assert sum(c["finished"] for c in classes) >= 10
        assert not any(c["rejected"] for c in classes)
        # Through the gateway, every request ran in the client's lane; none failed (the
        # streams still running when the run ended were cancelled).
        assert {(f.requester, f.lane) for f in finished} == {
            (client.requester, Lane.INTERACTIVE)
        }
        assert {f.outcome for f in finished} <= {"ok", "cancelled"}
