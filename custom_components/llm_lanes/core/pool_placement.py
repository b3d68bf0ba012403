"""Where a pool's request goes: among the servers its lane may use, those up and able to serve it.

The router (``router.py``) weighs the servers that are up; a request of a lane that may wait wakes
the most preferred sleeping one when none is up, and an urgent one never waits for one.
"""

from __future__ import annotations

from collections.abc import Callable

from custom_components.llm_lanes.core.availability import ServerState
from custom_components.llm_lanes.core.errors import (
    LanesError,
    LimitExceededError,
    NoServerError,
    WakeTimeoutError,
)
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatMessage, ChatRequest
from custom_components.llm_lanes.core.pool_journey import Journey
from custom_components.llm_lanes.core.pool_members import Member, PoolSettings
from custom_components.llm_lanes.core.router import (
    ANY_MODEL,
    Estimate,
    PromptShape,
    Router,
)


class Placement:
    """Places a pool's requests on its members (``ServerPool`` holds one)."""

    __slots__ = ("_clock", "members", "router", "settings")

    def __init__(
        self,
        members: dict[str, Member],
        settings: PoolSettings,
        clock: Callable[[], float],
    ) -> None:
        """Place on ``members`` (the pool's own, as they change) by ``settings``' routes."""
        self.members = members
        self.settings = settings
        self.router = Router(margin=settings.margin, margin_s=settings.margin_s)
        self._clock = clock

    def configure(self, settings: PoolSettings) -> None:
        """Take new routes and margins."""
        self.settings = settings
        self.router.margin, self.router.margin_s = settings.margin, settings.margin_s

    def route(self, lane: Lane) -> tuple[str, ...]:
        """Return the servers that may serve ``lane``, most preferred first.

        A lane the routes leave out may use every member; one routed to none, none.
        """
        names = self.settings.routes.get(lane)
        return names if names is not None else tuple(self.members)

    def estimate(
        self, request: ChatRequest, lane: Lane, prompt_tokens: int | None = None
    ) -> Estimate | None:
        """Where a request would go now and what it would feel there (None: no server is up).

        Routing's decision, as ``stream`` takes it (the conversation's incumbent is updated).
        """
        shape = self.router.shape(request, prompt_tokens)
        output = request.max_tokens
        up = [
            member
            for name in self.route(lane)
            if (member := self.members[name]).availability.state is ServerState.UP
            and self.refusal(member, request, shape, lane) is None
        ]
        if not up:
            return None
        return self.router.choose(
            [member.candidate for member in up],
            shape,
            lane,
            output if output is not None else lane.defaults.default_output_tokens,
            self._clock(),
        )

    async def next_server(self, journey: Journey, previous: Member | None) -> Member:
        """Return the server of the next attempt: routed among those up, else woken; or raise."""
        lane = journey.lane
        names = (journey.server,) if journey.server is not None else self.route(lane)
        while True:
            able: list[Member] = []
            reasons: list[str] = []
            breaches: list[LimitExceededError] = []
            for name in names:
                if name in journey.tried:
                    continue
                member = self.members.get(name)
                if member is None:
                    raise NoServerError(
                        lane=lane.key, reason=f"the pool has no server named {name}"
                    )
                refusal = self.refusal(member, journey.request, journey.shape, lane)
                if isinstance(refusal, LimitExceededError):
                    breaches.append(refusal)
                    reasons.append(f"{name}: {refusal.message}")
                elif refusal is not None:
                    reasons.append(f"{name}: {refusal}")
                else:
                    able.append(member)
            if not able:
                if breaches and len(breaches) == len(reasons) and not journey.tried:
                    raise breaches[0]  # the request breaks its lane's limits everywhere
                raise self._nothing_left(journey, reasons, previous)
            up = [m for m in able if m.availability.state is ServerState.UP]
            if up:
                chosen = self.router.choose(
                    [member.candidate for member in up],
                    journey.shape,
                    lane,
                    journey.max_tokens
                    if journey.max_tokens is not None
                    else lane.defaults.default_output_tokens,
                    self._clock(),
                )
                journey.expected_ttft_s = chosen.ttft_s
                return self.members[chosen.server]
            if lane.urgent:
                raise NoServerError(
                    lane=lane.key,
                    reason="every server that may serve it is down or asleep",
                )
            sleeping = [m for m in able if m.availability.can_wake]
            if not sleeping:
                raise NoServerError(
                    lane=lane.key, reason="every server that may serve it is down"
                )
            waking = [m for m in sleeping if m.availability.state is ServerState.WAKING]
            member = (waking or sleeping)[0]
            if await member.availability.awake():
                journey.expected_ttft_s = 0.0
                return member
            journey.tried.add(member.name)
            journey.failed = WakeTimeoutError(
                lane=lane.key,
                server=member.name,
                limit_s=member.config.power.wake_limit_s,
            )

    def alternative(self, journey: Journey, member: Member) -> bool:
        """Whether another server the request may move to is up."""
        if journey.server is not None:
            return False
        members = self.members
        return any(
            name != member.name
            and name not in journey.tried
            and members[name].availability.state is ServerState.UP
            for name in self.route(journey.lane)
        )

    def refusal(
        self, member: Member, request: ChatRequest, shape: PromptShape, lane: Lane
    ) -> LimitExceededError | str | None:
        """Why ``member`` cannot serve the request (None: it can)."""
        limits = member.scheduler.settings.lanes.get(lane)
        if limits is None:
            return f"it has no {lane.key} lane"
        output = (
            request.max_tokens
            if request.max_tokens is not None
            else limits.default_output_tokens
        )
        breach = limits.refusal(lane, prompt_tokens=shape.tokens, output_tokens=output)
        if breach is not None:
            return breach
        return member.candidate.capabilities.refusal(request, shape.tokens, output)

    def preferred(self, lane: Lane, now: float) -> Member | None:
        """Return the server the lane's next request would go to now (short, nothing warm)."""
        probe = ChatRequest(
            model=ANY_MODEL, messages=(ChatMessage(role="user", content="?"),)
        )
        shape = self.router.shape(probe, 1)
        up = [
            member
            for name in self.route(lane)
            if (member := self.members[name]).availability.state is ServerState.UP
        ]
        if not up:
            return None
        estimates = [
            self.router.estimate(member.candidate, shape, lane, 1, now) for member in up
        ]
        best = min(estimates, key=lambda e: e.felt_s)
        return self.members[best.server]

    def _nothing_left(
        self, journey: Journey, reasons: list[str], previous: Member | None
    ) -> LanesError:
        """Return the error of a request no server is left for."""
        if isinstance(journey.failed, LanesError):
            return journey.failed
        lane = journey.lane.key
        if previous is not None or journey.tried:
            return NoServerError(
                lane=lane, reason="every server that may serve it failed"
            )
        return NoServerError(
            lane=lane,
            reason="; ".join(reasons) or "the pool has no server for this lane",
        )
