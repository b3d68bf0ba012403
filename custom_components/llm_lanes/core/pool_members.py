"""The pool's servers: each as it is configured, and as it is at run time.

A member at run time holds its scheduler, what the router knows of it (``router.Candidate``),
whether it is up, down, asleep or waking (``availability.Availability``) and its counters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from custom_components.llm_lanes.core.availability import (
    PROBE_S,
    Availability,
    HealthCheck,
    PowerControl,
    ServerState,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.router import (
    DEFAULT_MARGIN,
    DEFAULT_MARGIN_S,
    DEFAULT_PREFILL_TOK_S,
    Candidate,
    Capabilities,
    Observed,
    RecentPrefixes,
)
from custom_components.llm_lanes.core.scheduler import Scheduler
from custom_components.llm_lanes.core.snapshot import FinishedRequest

type Listener = Callable[[FinishedRequest], None]

URGENT_STALL_S = 5.0
"""An urgent request whose server sends no token for this long moves to the next server."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolMember:
    """One server of a pool, as it is configured."""

    name: str
    scheduler: Scheduler
    """Its scheduler, built with the pool's quota ledger."""
    health: HealthCheck
    """Whether it answers now (``availability.answers(backend)``: it lists its models)."""
    capabilities: Capabilities = field(default_factory=Capabilities)
    power: PowerControl = field(default_factory=PowerControl)
    state: ServerState = ServerState.UP
    """Its state when the pool starts."""
    prefill_tok_s: float = DEFAULT_PREFILL_TOK_S
    """The prefill speed assumed until one is learned."""
    cached_prefixes: int | None = None
    """Prompt prefixes its cache is taken to hold where its slots are not known (None: twice
    its max sequences)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSettings:
    """How a pool routes."""

    routes: Mapping[Lane, tuple[str, ...]] = field(default_factory=dict)
    """Per lane, the servers that may serve it, most preferred first."""
    margin: float = DEFAULT_MARGIN
    margin_s: float = DEFAULT_MARGIN_S
    """How much faster another server must be expected to be for a request to leave its
    incumbent (``router.Router``)."""
    urgent_stall_s: float = URGENT_STALL_S
    probe_s: float = PROBE_S
    """How often a server that is down or waking is asked whether it answers."""


class Member:
    """A member at run time: its configuration, state and what the router knows of it."""

    __slots__ = (
        "availability",
        "candidate",
        "config",
        "failures_total",
        "name",
        "resumed_total",
        "scheduler",
        "served_total",
    )

    def __init__(
        self,
        config: PoolMember,
        settings: PoolSettings,
        clock: Callable[[], float],
        clock_rate: float,
    ) -> None:
        """Start a member as configured, on the pool's clock."""
        self.config = config
        self.name = config.name
        self.scheduler = config.scheduler
        load = config.scheduler.load
        self.candidate = Candidate(
            name=config.name,
            load=load,
            capabilities=config.capabilities,
            observed=Observed(config.prefill_tok_s),
            recent=RecentPrefixes(
                config.cached_prefixes
                if config.cached_prefixes is not None
                else 2 * max(load.settings.max_sequences, 1)
            ),
        )
        self.availability = Availability(
            config.name,
            health=config.health,
            power=config.power,
            busy=lambda: load.busy,
            clock=clock,
            clock_rate=clock_rate,
            probe_s=settings.probe_s,
            state=config.state,
        )
        self.served_total = 0
        self.failures_total = 0
        self.resumed_total = 0


def check_members(members: Sequence[PoolMember], settings: PoolSettings) -> None:
    """Raise ValueError when two members share a name or a route names an unknown server."""
    names: set[str] = set()
    for config in members:
        if config.name in names:
            raise ValueError(f"two servers of the pool are named {config.name!r}")
        names.add(config.name)
    for lane, route in settings.routes.items():
        unknown = [name for name in route if name not in names]
        if unknown:
            raise ValueError(
                f"the route of the {lane.key} lane names unknown servers: {', '.join(unknown)}"
            )


def noting_activity(availability: Availability) -> Listener:
    """Return a member scheduler's listener: each request that ends there is activity."""

    def note(_record: FinishedRequest) -> None:
        availability.activity()

    return note
