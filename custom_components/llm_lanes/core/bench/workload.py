"""Scenarios: who sends what, when, and which objectives they expect.

A scenario is one JSON object::

    {"name": "evening", "duration_s": 120, "warmup_s": 10, "seed": 1,
     "classes": [{"name": "voice", "lane": "voice", "requesters": ["satellite.kitchen"],
                  "arrival": {"process": "poisson", "rate_per_s": 0.2},
                  "prompt_tokens": {"mean": 150, "std": 20, "min": 50, "max": 400},
                  "output_tokens": {"mean": 25, "std": 5, "min": 5, "max": 60},
                  "slo": {"ttft_s": 0.5, "itl_s": 0.1}}]}

Arrival processes: ``poisson`` (``rate_per_s``), ``gamma`` (``rate_per_s`` and ``burstiness``, the
coefficient of variation of the gaps; 1 is Poisson), ``closed`` (``concurrency`` loops that send
the next request as soon as the previous one ends), ``burst`` (``size`` requests at once every
``every_s``), ``trace`` (``file``: a JSON list of arrival times in seconds, or of objects
``{"t", "prompt_tokens", "output_tokens"}``, relative to the scenario file).

Every class draws from its own generator seeded with the scenario seed and the class name, so
removing a class (the idle baseline) leaves the others' requests unchanged.

A scenario run over several servers (``scripts/bench run --server URL1 --server URL2``) may also
say what happens to them; servers are numbered from 1, in the order they are given::

    "events": [{"at_s": 20, "server": 1, "action": "kill"}, {"at_s": 40, "server": 1, "action": "start"}],
    "asleep_at_start": [1], "wake_delay_s": 8, "lane_servers": {"background": [1]}

``kill`` stops a server as a crash does (its streams break, connections are refused), ``start``
starts it again; a server ``asleep_at_start`` is stopped before the run and only its wake action
starts it (when the pool asks to wake it), ``wake_delay_s`` after the pool asks (a desktop resuming
from sleep); ``lane_servers`` lists, per lane, the servers that may serve it, most preferred first
(every server, in their order, for a lane it does not name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
import json
import math
from pathlib import Path
import random
from typing import TYPE_CHECKING, Any, Literal

from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.slot_context import BENCH_FILL

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PROCESSES = ("poisson", "gamma", "closed", "burst", "trace")
type ServerAction = Literal["kill", "start"]
SERVER_ACTIONS: tuple[ServerAction, ...] = ("kill", "start")
SCENARIO_DIR = Path(__file__).parent / "scenarios"
_WORDS = [
    "summarize",
    "the",
    "following",
    "household",
    "log",
    "entries",
    "noting",
    "anything",
    "unusual",
    "about",
    "energy",
    "heating",
    "doors",
    "windows",
    "lights",
    "motion",
    "presence",
    "weather",
    "calendar",
    "events",
    "and",
    "devices",
    "that",
    "reported",
    "errors",
    "during",
    "the",
    "day",
    "please",
    "be",
    "brief",
    "and",
    "precise",
]


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the offending field."""


@dataclass(frozen=True, slots=True)
class TokenDistribution:
    """A clipped normal distribution of token counts."""

    mean: float
    std: float
    min: int
    max: int

    def sample(self, rng: random.Random) -> int:
        """Draw one count."""
        value = rng.gauss(self.mean, self.std) if self.std > 0 else self.mean
        return int(min(self.max, max(self.min, round(value))))

    def scaled(self, factor: float) -> TokenDistribution:
        """Return the distribution with every count times ``factor`` (at least one token)."""
        low = max(1, int(self.min * factor))
        high = max(low, int(self.max * factor))
        return TokenDistribution(
            mean=min(high, max(low, self.mean * factor)),
            std=self.std * factor,
            min=low,
            max=high,
        )


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One arrival of a trace file."""

    t: float
    prompt_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Arrival:
    """How requests of a class arrive."""

    process: str
    rate_per_s: float = 0.0
    burstiness: float = 1.0
    concurrency: int = 0
    every_s: float = 0.0
    size: int = 0
    file: str | None = None
    trace: tuple[TraceEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class Objectives:
    """The class's service objectives (used for goodput)."""

    ttft_s: float
    itl_s: float


@dataclass(frozen=True, slots=True)
class RequestClass:
    """A kind of request in the scenario."""

    name: str
    lane: Lane
    requesters: tuple[str, ...]
    arrival: Arrival
    prompt_tokens: TokenDistribution
    output_tokens: TokenDistribution
    slo: Objectives
    shared_prefix_tokens: int = 0
    """Tokens of a stable system prompt before each request's own ``prompt_tokens``: the same
    text for every request of the class (and of every class naming the same
    ``shared_prefix_group``) within a run, as Home Assistant's Assist prompt is."""
    shared_prefix_group: str | None = None
    """Classes naming the same group share one prefix (default: the class's own)."""
    prepare_s: float = 0.0
    """How long before each request a command is announced (``Scheduler.prepare``, as the Assist
    pipeline does at speech-to-text); 0: never."""

    @property
    def prefix_group(self) -> str:
        """The name the class's shared prefix is drawn under."""
        return self.shared_prefix_group or self.name


@dataclass(frozen=True, slots=True)
class ServerEvent:
    """Something that happens to one server during a run (see the module docstring)."""

    at_s: float
    server: int
    """The server's number: 1 is the first given."""
    action: ServerAction


@dataclass(frozen=True, slots=True)
class Scenario:
    """A whole workload."""

    name: str
    duration_s: float
    warmup_s: float
    seed: int
    classes: tuple[RequestClass, ...]
    events: tuple[ServerEvent, ...] = ()
    """In time order."""
    asleep_at_start: tuple[int, ...] = ()
    wake_delay_s: float = 0.0
    lane_servers: Mapping[Lane, tuple[int, ...]] = field(default_factory=dict)

    @property
    def servers_named(self) -> int:
        """The highest server number the scenario names (0: it names none)."""
        return max(
            (
                *(event.server for event in self.events),
                *self.asleep_at_start,
                *(
                    server
                    for servers in self.lane_servers.values()
                    for server in servers
                ),
            ),
            default=0,
        )

    @property
    def switches_servers(self) -> frozenset[int]:
        """The servers the run stops or starts (its events and those asleep at the start)."""
        return frozenset(
            {event.server for event in self.events} | set(self.asleep_at_start)
        )

    def only(self, names: set[str]) -> Scenario:
        """Return the same scenario with only some classes (the idle baseline)."""
        unknown = names - {cls.name for cls in self.classes}
        if unknown:
            raise ScenarioError(f"no class named {', '.join(sorted(unknown))}")
        return replace(
            self,
            name=f"{self.name} ({', '.join(sorted(names))} alone)",
            classes=tuple(cls for cls in self.classes if cls.name in names),
        )

    def steady(self) -> Scenario:
        """Return the same workload on servers that stay up (no events, none asleep, no routes)."""
        return replace(
            self, events=(), asleep_at_start=(), wake_delay_s=0.0, lane_servers={}
        )

    def fitted(self, context_tokens: int | None, fill: float = BENCH_FILL) -> Scenario:
        """Return the scenario with every class's longest request within ``fill`` of a slot.

        A class whose longest prompt (its shared prefix included) and longest answer together
        exceed ``fill * context_tokens`` has its prompt and answer sizes scaled down by one factor,
        so its requests keep their shape; the others are unchanged. None: the server does not say.
        """
        if not context_tokens or context_tokens <= 0:
            return self
        room = fill * context_tokens
        classes = []
        for cls in self.classes:
            longest = (
                cls.shared_prefix_tokens + cls.prompt_tokens.max + cls.output_tokens.max
            )
            if longest <= room:
                classes.append(cls)
                continue
            factor = room / longest
            classes.append(
                replace(
                    cls,
                    prompt_tokens=cls.prompt_tokens.scaled(factor),
                    output_tokens=cls.output_tokens.scaled(factor),
                    shared_prefix_tokens=int(cls.shared_prefix_tokens * factor),
                )
            )
        return replace(self, classes=tuple(classes))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (as read)."""
        return {
            "name": self.name,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "seed": self.seed,
            "classes": [
                {
                    "name": cls.name,
                    "lane": cls.lane.key,
                    "requesters": list(cls.requesters),
                    "arrival": {
                        key: value
                        for key, value in {
                            "process": cls.arrival.process,
                            "rate_per_s": cls.arrival.rate_per_s,
                            "burstiness": cls.arrival.burstiness,
                            "concurrency": cls.arrival.concurrency,
                            "every_s": cls.arrival.every_s,
                            "size": cls.arrival.size,
                            "file": cls.arrival.file,
                        }.items()
                        if value
                    },
                    "prompt_tokens": _dist_dict(cls.prompt_tokens),
                    "output_tokens": _dist_dict(cls.output_tokens),
                    "slo": {"ttft_s": cls.slo.ttft_s, "itl_s": cls.slo.itl_s},
                    **{
                        key: value
                        for key, value in {
                            "shared_prefix_tokens": cls.shared_prefix_tokens,
                            "shared_prefix_group": cls.shared_prefix_group,
                            "prepare_s": cls.prepare_s,
                        }.items()
                        if value
                    },
                }
                for cls in self.classes
            ],
            **self._servers_dict(),
        }

    def _servers_dict(self) -> dict[str, Any]:
        """Return what the scenario says of its servers, in the JSON form (nothing if it says nothing)."""
        result: dict[str, Any] = {}
        if self.events:
            result["events"] = [
                {"at_s": event.at_s, "server": event.server, "action": event.action}
                for event in self.events
            ]
        if self.asleep_at_start:
            result["asleep_at_start"] = list(self.asleep_at_start)
        if self.wake_delay_s:
            result["wake_delay_s"] = self.wake_delay_s
        if self.lane_servers:
            result["lane_servers"] = {
                lane.key: list(servers) for lane, servers in self.lane_servers.items()
            }
        return result


def _dist_dict(dist: TokenDistribution) -> dict[str, float]:
    return {"mean": dist.mean, "std": dist.std, "min": dist.min, "max": dist.max}


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of an open-loop class, fixed before the run."""

    class_name: str
    index: int
    at_s: float
    requester: str
    prompt_tokens: int
    output_tokens: int


# --- loading ----------------------------------------------------------------------------------


def builtin_scenarios() -> dict[str, Path]:
    """Return the scenarios shipped with the integration, by name."""
    return {path.stem: path for path in sorted(SCENARIO_DIR.glob("*.json"))}


def load_scenario(source: str | Path) -> Scenario:
    """Load a scenario from a file path or the name of a built-in one."""
    path = Path(source)
    if not path.exists():
        builtin = builtin_scenarios()
        if str(source) not in builtin:
            raise ScenarioError(
                f"no scenario file {source!s} and no built-in scenario of that name "
                f"(built-in: {', '.join(builtin)})"
            )
        path = builtin[str(source)]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ScenarioError(f"{path}: not valid JSON: {err}") from err
    return parse_scenario(data, base_dir=path.parent)


def parse_scenario(data: Any, *, base_dir: Path | None = None) -> Scenario:
    """Validate a scenario's JSON object; raise ``ScenarioError`` naming the bad field."""
    obj = _object(data, "scenario")
    _no_extra(obj, Scenario, "scenario")
    name = _string(obj, "name", "scenario")
    duration = _number(obj, "duration_s", "scenario", minimum=0, exclusive=True)
    warmup = _number(obj, "warmup_s", "scenario", default=0.0, minimum=0)
    if warmup >= duration:
        raise ScenarioError("scenario.warmup_s: must be shorter than duration_s")
    seed = int(_number(obj, "seed", "scenario", default=0))
    raw_classes = obj.get("classes")
    if not isinstance(raw_classes, list) or not raw_classes:
        raise ScenarioError("scenario.classes: must be a non-empty list")
    classes = tuple(
        _parse_class(raw, f"classes[{i}]", base_dir)
        for i, raw in enumerate(raw_classes)
    )
    names = [cls.name for cls in classes]
    if len(set(names)) != len(names):
        raise ScenarioError("scenario.classes: class names must be unique")
    return Scenario(
        name=name,
        duration_s=duration,
        warmup_s=warmup,
        seed=seed,
        classes=classes,
        events=_parse_events(obj.get("events", []), duration),
        asleep_at_start=_server_list(
            obj.get("asleep_at_start", []), "scenario.asleep_at_start"
        ),
        wake_delay_s=_number(obj, "wake_delay_s", "scenario", default=0.0, minimum=0),
        lane_servers=_parse_lane_servers(obj.get("lane_servers", {})),
    )


def _parse_events(data: Any, duration_s: float) -> tuple[ServerEvent, ...]:
    if not isinstance(data, list):
        raise ScenarioError("scenario.events: must be a list")
    events: list[ServerEvent] = []
    for i, raw in enumerate(data):
        where = f"scenario.events[{i}]"
        obj = _object(raw, where)
        _no_extra(obj, ServerEvent, where)
        at_s = _number(obj, "at_s", where, minimum=0)
        if at_s >= duration_s:
            raise ScenarioError(f"{where}.at_s: must be before duration_s")
        action = _string(obj, "action", where)
        if action not in SERVER_ACTIONS:
            raise ScenarioError(
                f"{where}.action: must be one of {', '.join(SERVER_ACTIONS)}"
            )
        events.append(
            ServerEvent(
                at_s=at_s,
                server=_server_number(obj.get("server"), f"{where}.server"),
                action=action,
            )
        )
    return tuple(sorted(events, key=lambda event: event.at_s))


def _parse_lane_servers(data: Any) -> dict[Lane, tuple[int, ...]]:
    obj = _object(data, "scenario.lane_servers")
    routes: dict[Lane, tuple[int, ...]] = {}
    for key, servers in obj.items():
        where = f"scenario.lane_servers.{key}"
        try:
            lane = Lane.from_key(key)
        except ValueError as err:
            raise ScenarioError(f"{where}: {err}") from None
        routes[lane] = _server_list(servers, where)
        if not routes[lane]:
            raise ScenarioError(f"{where}: must name at least one server")
    return routes


def _server_list(data: Any, where: str) -> tuple[int, ...]:
    if not isinstance(data, list):
        raise ScenarioError(f"{where}: must be a list of server numbers")
    servers = tuple(
        _server_number(value, f"{where}[{i}]") for i, value in enumerate(data)
    )
    if len(set(servers)) != len(servers):
        raise ScenarioError(f"{where}: names a server twice")
    return servers


def _server_number(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScenarioError(f"{where}: must be a server number (1 is the first given)")
    return value


def _parse_class(data: Any, where: str, base_dir: Path | None) -> RequestClass:
    obj = _object(data, where)
    _no_extra(obj, RequestClass, where)
    name = _string(obj, "name", where)
    lane_key = _string(obj, "lane", where)
    try:
        lane = Lane.from_key(lane_key)
    except ValueError as err:
        raise ScenarioError(f"{where}.lane: {err}") from None
    requesters = obj.get("requesters", [f"bench.{name}"])
    if (
        not isinstance(requesters, list)
        or not requesters
        or not all(isinstance(r, str) and r for r in requesters)
    ):
        raise ScenarioError(f"{where}.requesters: must be a non-empty list of names")
    slo_obj = _object(obj.get("slo"), f"{where}.slo")
    slo = Objectives(
        ttft_s=_number(slo_obj, "ttft_s", f"{where}.slo", minimum=0, exclusive=True),
        itl_s=_number(slo_obj, "itl_s", f"{where}.slo", minimum=0, exclusive=True),
    )
    return RequestClass(
        name=name,
        lane=lane,
        requesters=tuple(requesters),
        arrival=_parse_arrival(obj.get("arrival"), f"{where}.arrival", base_dir),
        prompt_tokens=_parse_dist(obj.get("prompt_tokens"), f"{where}.prompt_tokens"),
        output_tokens=_parse_dist(obj.get("output_tokens"), f"{where}.output_tokens"),
        slo=slo,
        shared_prefix_tokens=_integer(
            _number(obj, "shared_prefix_tokens", where, default=0, minimum=0),
            f"{where}.shared_prefix_tokens",
        ),
        shared_prefix_group=_optional_string(obj, "shared_prefix_group", where),
        prepare_s=_number(obj, "prepare_s", where, default=0.0, minimum=0),
    )


def _parse_arrival(data: Any, where: str, base_dir: Path | None) -> Arrival:
    obj = _object(data, where)
    _no_extra(obj, Arrival, where, derived={"trace"})
    process = _string(obj, "process", where)
    if process not in PROCESSES:
        raise ScenarioError(f"{where}.process: must be one of {', '.join(PROCESSES)}")
    if process in {"poisson", "gamma"}:
        return Arrival(
            process=process,
            rate_per_s=_number(obj, "rate_per_s", where, minimum=0, exclusive=True),
            burstiness=_number(
                obj, "burstiness", where, default=1.0, minimum=0, exclusive=True
            ),
        )
    if process == "closed":
        concurrency = _number(obj, "concurrency", where, minimum=1)
        return Arrival(
            process=process, concurrency=_integer(concurrency, f"{where}.concurrency")
        )
    if process == "burst":
        size = _number(obj, "size", where, minimum=1)
        return Arrival(
            process=process,
            every_s=_number(obj, "every_s", where, minimum=0, exclusive=True),
            size=_integer(size, f"{where}.size"),
        )
    file = _string(obj, "file", where)
    path = (
        Path(file) if base_dir is None or Path(file).is_absolute() else base_dir / file
    )
    return Arrival(process=process, file=file, trace=_read_trace(path, f"{where}.file"))


def _read_trace(path: Path, where: str) -> tuple[TraceEntry, ...]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ScenarioError(f"{where}: cannot read trace {path}: {err}") from err
    if not isinstance(data, list):
        raise ScenarioError(f"{where}: a trace is a JSON list")
    entries: list[TraceEntry] = []
    for i, item in enumerate(data):
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            entries.append(TraceEntry(t=float(item)))
        elif isinstance(item, dict) and isinstance(item.get("t"), (int, float)):
            entries.append(
                TraceEntry(
                    t=float(item["t"]),
                    prompt_tokens=item.get("prompt_tokens"),
                    output_tokens=item.get("output_tokens"),
                )
            )
        else:
            raise ScenarioError(f"{where}[{i}]: expected a time or an object with t")
        if entries[-1].t < 0:
            raise ScenarioError(f"{where}[{i}]: times must not be negative")
    return tuple(sorted(entries, key=lambda entry: entry.t))


def _parse_dist(data: Any, where: str) -> TokenDistribution:
    obj = _object(data, where)
    _no_extra(obj, TokenDistribution, where)
    mean = _number(obj, "mean", where, minimum=1)
    std = _number(obj, "std", where, default=0.0, minimum=0)
    low = _integer(_number(obj, "min", where, default=1, minimum=1), f"{where}.min")
    high = _integer(
        _number(obj, "max", where, default=max(mean * 4, mean + 4 * std)),
        f"{where}.max",
    )
    if not low <= mean <= high:
        raise ScenarioError(f"{where}: needs min <= mean <= max")
    return TokenDistribution(mean=mean, std=std, min=low, max=high)


def _object(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: must be an object")
    return data


def _no_extra(
    obj: dict[str, Any],
    kind: type[DataclassInstance],
    where: str,
    *,
    derived: set[str] | None = None,
) -> None:
    """Refuse fields that are not fields of ``kind`` (its ``derived`` ones are not read either)."""
    allowed = {item.name for item in fields(kind)} - (derived or set())
    extra = set(obj) - allowed
    if extra:
        raise ScenarioError(f"{where}: unknown field {', '.join(sorted(extra))}")


def _string(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{where}.{key}: must be a non-empty string")
    return value


def _optional_string(obj: dict[str, Any], key: str, where: str) -> str | None:
    return None if obj.get(key) is None else _string(obj, key, where)


def _number(
    obj: dict[str, Any],
    key: str,
    where: str,
    *,
    default: float | None = None,
    minimum: float | None = None,
    exclusive: bool = False,
) -> float:
    value = obj.get(key, default)
    if value is None:
        raise ScenarioError(f"{where}.{key}: is required")
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
    ):
        raise ScenarioError(f"{where}.{key}: must be a number")
    if minimum is not None and (value <= minimum if exclusive else value < minimum):
        raise ScenarioError(
            f"{where}.{key}: must be {'>' if exclusive else '>='} {minimum}"
        )
    return float(value)


def _integer(value: float, where: str) -> int:
    if not float(value).is_integer():
        raise ScenarioError(f"{where}: must be a whole number")
    return int(value)


# --- arrivals ---------------------------------------------------------------------------------


def class_rng(
    scenario: Scenario, cls: RequestClass, stream: str = "open"
) -> random.Random:
    """Return the generator of one class (independent of the other classes)."""
    return random.Random(f"{scenario.seed}:{cls.name}:{stream}")


def arrival_times(
    arrival: Arrival, duration_s: float, rng: random.Random
) -> list[float]:
    """Arrival times in [0, duration) of an open-loop process (closed has none)."""
    times: list[float] = []
    if arrival.process in {"poisson", "gamma"}:
        mean_gap = 1.0 / arrival.rate_per_s
        shape = 1.0 if arrival.process == "poisson" else 1.0 / arrival.burstiness**2
        t = rng.gammavariate(shape, mean_gap / shape)
        while t < duration_s:
            times.append(t)
            t += rng.gammavariate(shape, mean_gap / shape)
    elif arrival.process == "burst":
        t = arrival.every_s
        while t < duration_s:
            times.extend([t] * arrival.size)
            t += arrival.every_s
    elif arrival.process == "trace":
        times = [entry.t for entry in arrival.trace if entry.t < duration_s]
    return times


def plan_open_requests(scenario: Scenario) -> list[PlannedRequest]:
    """Every open-loop request of the scenario, in arrival order."""
    planned: list[PlannedRequest] = []
    for cls in scenario.classes:
        if cls.arrival.process == "closed":
            continue
        rng = class_rng(scenario, cls)
        times = arrival_times(cls.arrival, scenario.duration_s, rng)
        trace = cls.arrival.trace
        for index, at in enumerate(times):
            prompt = cls.prompt_tokens.sample(rng)
            output = cls.output_tokens.sample(rng)
            if cls.arrival.process == "trace":
                prompt = trace[index].prompt_tokens or prompt
                output = trace[index].output_tokens or output
            planned.append(
                PlannedRequest(
                    class_name=cls.name,
                    index=index,
                    at_s=at,
                    requester=cls.requesters[index % len(cls.requesters)],
                    prompt_tokens=prompt,
                    output_tokens=output,
                )
            )
    planned.sort(key=lambda request: (request.at_s, request.class_name, request.index))
    return planned


def prompt_text(tokens: int, rng: random.Random, *, scale: float = 1.0) -> str:
    """Return a unique prompt of about ``tokens`` tokens (4 characters each, template included)."""
    # ``scale`` stretches the text for servers whose tokenizer packs more than 4 characters a token.
    chars = max(4, round((tokens - 4) * 4 * scale))
    words = [f"#{rng.getrandbits(32):08x}"]
    length = len(words[0])
    while length < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:chars]
