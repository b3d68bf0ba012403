"""What a lane is: a priority class of requests, as data the scheduling rules read.

A lane says where it ranks, what kind of wait its requests stand for, and the limits and objectives
its requests get when the user has set none. The rules (``policy.py``, ``foreground.py``,
``batch_cost.py``, ``slots.py``, ``admission.py``, ``accounting.py``) read these traits, never a
lane's name:

- ``foreground``: people wait on it (voice, typed chats). It may take the headroom and the slots
  kept warm for it, and while it is active background keeps only the streams that hold its
  objectives.
- ``urgent``: someone is waiting for it right now with nothing else to look at (voice). Aging never
  lifts another request to its rank; while it is active, long background prompts wait and a
  background prefill makes way; it can be announced before its text is known
  (``Scheduler.prepare``). Urgent lanes are foreground lanes.
- ``yields``: it uses what the others leave (background). It is guaranteed its share of the
  service while it waits, its streams are the ones preempted for the others, it borrows the
  headroom only while nobody needs it, and the pause switch and the prefill guard hold it. A
  requester over their quota is demoted to the last yielding lane.

The household's four lanes are ``LANES``; a scheduler runs the lanes its settings list (a test can
define a fifth one). Adding a lane to the integration is one more ``Lane`` in ``LANES`` plus its name
in the translations (``selector.lane.options``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from custom_components.llm_lanes.core.errors import LimitExceededError


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneLimits:
    """Per-lane limits and service objectives.

    A request that breaks a limit is refused before anything reaches the server.
    """

    max_prompt_tokens: int
    """Context limit: the most prompt tokens a request of this lane may carry."""
    default_output_tokens: int
    """max_tokens sent to the server when the caller gives none."""
    max_output_tokens: int
    """The most output tokens a caller may ask for."""
    max_queued: int
    """The most requests of this lane waiting at once; one more is rejected."""
    max_wait_s: float
    """The longest a request may wait in the queue before it fails with a timeout."""
    max_concurrency: int | None = None
    """Optional cap on sequences of this lane in flight at once."""
    ttft_slo_s: float
    """Time-to-first-token objective used for goodput."""
    itl_slo_s: float
    """Inter-token-latency objective (p95 of one request's gaps) used for goodput."""
    itl_slowdown_slo: float | None = None
    """For a foreground lane: how much slower than one stream alone on the server its tokens may
    come while background streams share the server's batch (2.0: at most twice the gap). With the
    learned batch cost this decides how many background streams keep running beside it
    (``batch_cost.BackgroundLimiter``); None: only ``itl_slo_s`` bounds them."""

    def refusal(
        self, lane: Lane, *, prompt_tokens: int, output_tokens: int
    ) -> LimitExceededError | None:
        """Return the error for a request of ``lane`` that breaks a limit (None if none)."""
        for limit, value, maximum in (
            ("max_output_tokens", output_tokens, self.max_output_tokens),
            ("max_prompt_tokens", prompt_tokens, self.max_prompt_tokens),
        ):
            if value > maximum:
                return LimitExceededError(
                    lane=lane.key, limit=limit, value=value, maximum=maximum
                )
        return None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Lane:
    """A priority class of requests (see the module docstring for what its traits mean).

    Lanes compare by identity and sort by rank; each is defined once.
    """

    key: str
    """Lower-case name used in settings, entity keys, events and translations."""
    rank: int
    """Order of service, lower first; also the priority passed to servers that take one."""
    foreground: bool = False
    urgent: bool = False
    yields: bool = False
    defaults: LaneLimits
    """Its limits and objectives when the user has set none."""

    VOICE: ClassVar[Lane]
    INTERACTIVE: ClassVar[Lane]
    AUTOMATION: ClassVar[Lane]
    BACKGROUND: ClassVar[Lane]

    def __lt__(self, other: Lane) -> bool:
        """Order by rank (served first is smaller)."""
        return self.rank < other.rank

    def __repr__(self) -> str:
        """Name the lane."""
        return f"Lane.{self.key}"

    @classmethod
    def from_key(cls, key: str, lanes: Iterable[Lane] | None = None) -> Lane:
        """Return the lane of ``lanes`` (the household's by default) named ``key``."""
        known = tuple(LANES if lanes is None else lanes)
        for lane in known:
            if lane.key == key:
                return lane
        raise ValueError(
            f"unknown lane {key!r}; expected one of {', '.join(lane.key for lane in known)}"
        )


def _limits(
    row: tuple[int, int, int, int, float, float, float, float | None],
) -> LaneLimits:
    prompt, default_output, max_output, queued, wait_s, ttft_s, itl_s, slowdown = row
    return LaneLimits(
        max_prompt_tokens=prompt,
        default_output_tokens=default_output,
        max_output_tokens=max_output,
        max_queued=queued,
        max_wait_s=wait_s,
        ttft_slo_s=ttft_s,
        itl_slo_s=itl_s,
        itl_slowdown_slo=slowdown,
    )


# The household's lanes.    prompt  default out  max out  queued  wait (s)    TTFT  ITL   slowdown
Lane.VOICE = Lane(
    key="voice", rank=0, foreground=True, urgent=True,
    defaults=_limits((8192,  256,         1024,    16,     15.0,       0.5,  0.1,  2.0)),
)  # fmt: skip
Lane.INTERACTIVE = Lane(
    key="interactive", rank=1, foreground=True,
    defaults=_limits((8192,  512,         2048,    32,     60.0,       1.0,  0.15, 2.0)),
)  # fmt: skip
Lane.AUTOMATION = Lane(
    key="automation", rank=2,
    defaults=_limits((8192,  512,         2048,    64,     300.0,      5.0,  0.25, None)),
)  # fmt: skip
Lane.BACKGROUND = Lane(
    key="background", rank=3, yields=True,
    defaults=_limits((16384, 1024,        4096,    256,    6 * 3600.0, 60.0, 1.0,  None)),
)  # fmt: skip

LANES: tuple[Lane, ...] = (
    Lane.VOICE,
    Lane.INTERACTIVE,
    Lane.AUTOMATION,
    Lane.BACKGROUND,
)
"""The household's lanes, in order of service."""

DEFAULT_LANE_LIMITS: dict[Lane, LaneLimits] = {lane: lane.defaults for lane in LANES}
"""The limits and objectives of each lane when the user has set none."""


def check_lanes(lanes: Iterable[Lane]) -> tuple[Lane, ...]:
    """Return the lanes in order of service, or raise ValueError when the rules cannot run them.

    The rules assume distinct keys and ranks, urgent lanes that are foreground lanes and rank
    before every other, foreground lanes before the others, and yielding lanes last (never
    foreground), with at least one of them (a demoted request needs a lane to go to).
    """
    ordered = tuple(sorted(lanes))
    if len({lane.key for lane in ordered}) != len(ordered) or len(
        {lane.rank for lane in ordered}
    ) != len(ordered):
        raise ValueError("lanes need distinct keys and ranks")
    if any(lane.urgent and not lane.foreground for lane in ordered):
        raise ValueError("an urgent lane must be a foreground lane")
    if any(lane.yields and lane.foreground for lane in ordered):
        raise ValueError("a yielding lane cannot be a foreground lane")
    for trait in ("urgent", "foreground"):
        flags = [getattr(lane, trait) for lane in ordered]
        if flags != sorted(flags, reverse=True):
            raise ValueError(f"{trait} lanes must rank before the others")
    flags = [lane.yields for lane in ordered]
    if flags != sorted(flags) or not any(flags):
        raise ValueError("yielding lanes must rank last, and one must exist")
    return ordered
