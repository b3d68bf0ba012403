"""Scenario parsing, validation and arrival processes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
import random
from typing import Any

import pytest

from custom_components.llm_lanes.core.bench.calibrate import shorten
from custom_components.llm_lanes.core.bench.workload import (
    Arrival,
    ScenarioError,
    ServerEvent,
    arrival_times,
    builtin_scenarios,
    load_scenario,
    parse_scenario,
    plan_open_requests,
    prompt_text,
)
from custom_components.llm_lanes.core.lanes import Lane
from tools.simulator.answers import count_text_tokens

VALID: dict[str, Any] = {
    "name": "test",
    "duration_s": 100,
    "warmup_s": 10,
    "seed": 5,
    "classes": [
        {
            "name": "voice",
            "lane": "voice",
            "requesters": ["satellite.a", "satellite.b"],
            "arrival": {"process": "poisson", "rate_per_s": 0.5},
            "prompt_tokens": {"mean": 150, "std": 20, "min": 100, "max": 200},
            "output_tokens": {"mean": 25, "std": 5, "min": 10, "max": 40},
            "slo": {"ttft_s": 0.5, "itl_s": 0.1},
        },
        {
            "name": "summaries",
            "lane": "background",
            "arrival": {"process": "closed", "concurrency": 2},
            "prompt_tokens": {"mean": 1200},
            "output_tokens": {"mean": 400},
            "slo": {"ttft_s": 60, "itl_s": 1},
        },
    ],
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """Copy VALID with one field replaced (``None`` deletes it)."""
    data = copy.deepcopy(VALID)
    target: Any = data
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        target = target[key]
    if value is None:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return data


def test_valid_scenario_parses() -> None:
    """Every field lands where it belongs; defaults fill the optional ones."""
    scenario = parse_scenario(VALID)
    assert scenario.name == "test"
    assert scenario.duration_s == 100
    voice, summaries = scenario.classes
    assert voice.lane is Lane.VOICE
    assert voice.requesters == ("satellite.a", "satellite.b")
    assert voice.arrival == Arrival(process="poisson", rate_per_s=0.5)
    assert voice.slo.itl_s == 0.1
    assert summaries.arrival.concurrency == 2
    assert summaries.requesters == ("bench.summaries",)
    assert summaries.prompt_tokens.std == 0
    assert summaries.prompt_tokens.max >= 1200


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("duration_s", 0, "scenario.duration_s: must be > 0"),
        ("warmup_s", 200, "warmup_s: must be shorter than duration_s"),
        ("name", None, "scenario.name: must be a non-empty string"),
        ("classes", [], "scenario.classes: must be a non-empty list"),
        ("classes.0.lane", "urgent", "classes[0].lane: unknown lane 'urgent'"),
        (
            "classes.0.arrival.process",
            "uniform",
            "classes[0].arrival.process: must be one of",
        ),
        (
            "classes.0.arrival.rate_per_s",
            None,
            "classes[0].arrival.rate_per_s: is required",
        ),
        (
            "classes.0.arrival.rate_per_s",
            "fast",
            "classes[0].arrival.rate_per_s: must be a number",
        ),
        (
            "classes.1.arrival.concurrency",
            1.5,
            "classes[1].arrival.concurrency: must be a whole number",
        ),
        (
            "classes.0.prompt_tokens.min",
            300,
            "classes[0].prompt_tokens: needs min <= mean <= max",
        ),
        ("classes.0.slo.itl_s", -1, "classes[0].slo.itl_s: must be > 0"),
        ("classes.0.requesters", [], "classes[0].requesters: must be a non-empty list"),
        ("classes.0.colour", "red", "classes[0]: unknown field colour"),
        ("classes.1.name", "voice", "class names must be unique"),
    ],
)
def test_invalid_scenarios_name_the_field(path: str, value: Any, message: str) -> None:
    """Each mistake is refused with a message that points at the field."""
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_with(path, value))
    assert message in str(err.value)


def test_burst_and_trace(tmp_path: Path) -> None:
    """Bursts come in whole groups; a trace replays its file relative to the scenario."""
    trace = tmp_path / "trace.json"
    trace.write_text(
        json.dumps([3.5, {"t": 1.0, "prompt_tokens": 77, "output_tokens": 9}, 150])
    )
    data = copy.deepcopy(VALID)
    data["classes"] = [
        _with("classes.0.arrival", {"process": "burst", "every_s": 30, "size": 4})[
            "classes"
        ][0],
        {
            **data["classes"][0],
            "name": "replay",
            "arrival": {"process": "trace", "file": "trace.json"},
        },
    ]
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(data))
    planned = plan_open_requests(load_scenario(path))
    bursts = [p.at_s for p in planned if p.class_name == "voice"]
    assert bursts == [30.0] * 4 + [60.0] * 4 + [90.0] * 4
    replay = [p for p in planned if p.class_name == "replay"]
    assert [p.at_s for p in replay] == [1.0, 3.5]  # 150 s is past the end
    assert (replay[0].prompt_tokens, replay[0].output_tokens) == (77, 9)


def test_missing_trace_file_is_an_error(tmp_path: Path) -> None:
    """A trace that cannot be read is a scenario error, not a crash."""
    data = _with("classes.0.arrival", {"process": "trace", "file": "nowhere.json"})
    with pytest.raises(
        ScenarioError, match=r"classes\[0\]\.arrival\.file: cannot read trace"
    ):
        parse_scenario(data, base_dir=tmp_path)


def test_poisson_count_under_a_seed() -> None:
    """A Poisson process at 2/s over 1,000 s gives about 2,000 arrivals, the same each time."""
    arrival = Arrival(process="poisson", rate_per_s=2.0)
    first = arrival_times(arrival, 1000, random.Random(42))
    again = arrival_times(arrival, 1000, random.Random(42))
    assert first == again
    assert 1850 <= len(first) <= 2150  # 3.4 standard deviations
    assert all(0 <= t < 1000 for t in first)
    assert first == sorted(first)


def test_gamma_burstiness_keeps_the_rate_and_widens_the_gaps() -> None:
    """Burstiness 3 keeps the mean rate but makes the gaps far more variable than Poisson."""
    bursty = arrival_times(
        Arrival(process="gamma", rate_per_s=2.0, burstiness=3.0), 2000, random.Random(1)
    )
    steady = arrival_times(
        Arrival(process="poisson", rate_per_s=2.0), 2000, random.Random(1)
    )

    def cv(times: list[float]) -> float:
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        mean = sum(gaps) / len(gaps)
        return (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean

    assert 3400 <= len(bursty) <= 4600
    assert cv(bursty) > 2.0
    assert 0.85 < cv(steady) < 1.15


def test_removing_a_class_keeps_the_others_requests() -> None:
    """The idle baseline (one class alone) replays exactly the same requests of that class."""
    scenario = parse_scenario(VALID)
    alone = scenario.only({"voice"})
    full = [p for p in plan_open_requests(scenario) if p.class_name == "voice"]
    assert plan_open_requests(alone) == full
    assert {p.requester for p in full} == {"satellite.a", "satellite.b"}
    assert all(100 <= p.prompt_tokens <= 200 for p in full)
    with pytest.raises(ScenarioError, match="no class named nobody"):
        scenario.only({"nobody"})


def test_builtin_scenarios_load() -> None:
    """Every shipped scenario is valid, including the ones the issue asks for."""
    names = set(builtin_scenarios())
    assert {
        "evening",
        "night",
        "rag_heavy",
        "automation_burst",
        "voice_vs_background",
        "assist_evening",
    } <= names
    for name in names:
        scenario = load_scenario(name)
        assert scenario.classes
        assert parse_scenario(scenario.to_dict()) == scenario


def test_unknown_scenario_name() -> None:
    """A name that is neither a file nor built in says which ones exist."""
    with pytest.raises(ScenarioError, match="built-in: .*evening"):
        load_scenario("no_such_scenario")


def test_prompt_text_has_the_asked_size_and_is_unique() -> None:
    """Prompts are the planned size by the simulator's count and never repeat (no prompt cache hits)."""
    rng = random.Random(3)
    first, second = prompt_text(150, rng), prompt_text(150, rng)
    assert first != second
    assert count_text_tokens(first) + 4 == 150


SERVERS: dict[str, Any] = {
    "events": [
        {"at_s": 60, "server": 1, "action": "start"},
        {"at_s": 30, "server": 1, "action": "kill"},
    ],
    "asleep_at_start": [2],
    "wake_delay_s": 8,
    "lane_servers": {"background": [2], "voice": [1, 2]},
}


def test_what_happens_to_the_servers_parses_in_time_order() -> None:
    """Events are sorted by time; servers are numbers from 1; the JSON form reads back the same."""
    scenario = parse_scenario(VALID | SERVERS)
    assert scenario.events == (
        ServerEvent(at_s=30, server=1, action="kill"),
        ServerEvent(at_s=60, server=1, action="start"),
    )
    assert scenario.asleep_at_start == (2,)
    assert scenario.wake_delay_s == 8
    assert scenario.lane_servers == {Lane.BACKGROUND: (2,), Lane.VOICE: (1, 2)}
    assert scenario.servers_named == 2
    assert scenario.switches_servers == {1, 2}
    assert parse_scenario(scenario.to_dict()) == scenario
    steady = scenario.steady()
    assert (steady.events, steady.asleep_at_start, steady.lane_servers) == ((), (), {})
    assert steady.servers_named == 0
    assert scenario.only({"voice"}).events == scenario.events
    assert parse_scenario(VALID).to_dict().keys() == VALID.keys()


def test_shortening_a_scenario_drops_its_later_events() -> None:
    """``--duration`` cuts the events after the new end (they would never happen)."""
    scenario = shorten(parse_scenario(VALID | SERVERS), 45.0)
    assert scenario.events == (ServerEvent(at_s=30, server=1, action="kill"),)


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ({"events": {}}, "scenario.events: must be a list"),
        (
            {"events": [{"at_s": 5, "server": 1, "action": "reboot"}]},
            "scenario.events[0].action: must be one of kill, start",
        ),
        (
            {"events": [{"at_s": 5, "server": 0, "action": "kill"}]},
            "scenario.events[0].server: must be a server number (1 is the first given)",
        ),
        (
            {"events": [{"at_s": 100, "server": 1, "action": "kill"}]},
            "scenario.events[0].at_s: must be before duration_s",
        ),
        (
            {"events": [{"at_s": 5, "server": 1, "action": "kill", "why": "x"}]},
            "scenario.events[0]: unknown field why",
        ),
        ({"asleep_at_start": [1, 1]}, "scenario.asleep_at_start: names a server twice"),
        ({"asleep_at_start": 1}, "scenario.asleep_at_start: must be a list"),
        ({"wake_delay_s": -1}, "scenario.wake_delay_s: must be >= 0"),
        ({"lane_servers": {"urgent": [1]}}, "scenario.lane_servers.urgent: unknown lane"),
        ({"lane_servers": {"voice": []}}, "scenario.lane_servers.voice: must name at least one server"),
        ({"lane_servers": {"voice": ["gpu"]}}, "scenario.lane_servers.voice[0]: must be a server number"),
    ],
)  # fmt: skip
def test_invalid_server_fields_name_the_field(
    servers: dict[str, Any], message: str
) -> None:
    """Each mistake in what happens to the servers is refused, naming the field."""
    with pytest.raises(ScenarioError) as err:
        parse_scenario(VALID | servers)
    assert message in str(err.value)


def test_the_repository_scenarios_parse() -> None:
    """The scenarios of tools/bench/scenarios load, the two of the pool with what they say of servers."""
    folder = Path(__file__).parents[3] / "tools" / "bench" / "scenarios"
    scenarios = {path.stem: load_scenario(path) for path in folder.glob("*.json")}
    failover = scenarios["failover_evening"]
    assert [(e.server, e.action) for e in failover.events] == [
        (1, "kill"),
        (1, "start"),
    ]
    waking = scenarios["waking_box"]
    assert waking.asleep_at_start == (1,)
    assert waking.lane_servers == {Lane.BACKGROUND: (1,)}
    readme = (folder / "README.md").read_text()
    assert all(f"`{name}.json`" in readme for name in scenarios)
