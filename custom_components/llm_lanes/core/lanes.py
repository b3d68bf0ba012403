"""What a lane is: the four priority classes of requests and the limits each one enforces."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .errors import LimitExceededError


class Lane(IntEnum):
    """Priority class of a request; a lower value is served first."""

    VOICE = 0
    INTERACTIVE = 1
    AUTOMATION = 2
    BACKGROUND = 3

    @property
    def key(self) -> str:
        """Lower-case name used in settings, entity keys and events."""
        return self.name.lower()

    @classmethod
    def from_key(cls, key: str) -> Lane:
        """Parse a lane from its lower-case name."""
        try:
            return cls[key.upper()]
        except KeyError:
            raise ValueError(
                f"unknown lane {key!r}; expected one of {', '.join(lane.key for lane in cls)}"
            ) from None


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


DEFAULT_LANE_LIMITS: dict[Lane, LaneLimits] = {
    Lane.VOICE: LaneLimits(
        max_prompt_tokens=8192,
        default_output_tokens=256,
        max_output_tokens=1024,
        max_queued=16,
        max_wait_s=15.0,
        ttft_slo_s=0.5,
        itl_slo_s=0.1,
    ),
    Lane.INTERACTIVE: LaneLimits(
        max_prompt_tokens=8192,
        default_output_tokens=512,
        max_output_tokens=2048,
        max_queued=32,
        max_wait_s=60.0,
        ttft_slo_s=1.0,
        itl_slo_s=0.15,
    ),
    Lane.AUTOMATION: LaneLimits(
        max_prompt_tokens=8192,
        default_output_tokens=512,
        max_output_tokens=2048,
        max_queued=64,
        max_wait_s=300.0,
        ttft_slo_s=5.0,
        itl_slo_s=0.25,
    ),
    Lane.BACKGROUND: LaneLimits(
        max_prompt_tokens=16384,
        default_output_tokens=1024,
        max_output_tokens=4096,
        max_queued=256,
        max_wait_s=6 * 3600.0,
        max_concurrency=2,
        ttft_slo_s=60.0,
        itl_slo_s=1.0,
    ),
}
