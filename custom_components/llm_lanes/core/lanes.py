"""What a lane is: the four priority classes of requests and the limits each one enforces."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from custom_components.llm_lanes.core.errors import LimitExceededError


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


FOREGROUND_LANES = (Lane.VOICE, Lane.INTERACTIVE)
"""The lanes people wait on: the headroom, warm slots and the background limit are theirs."""


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


_DEFAULTS = (
    # lane              prompt  default out  max out  queued  wait (s)   streams  TTFT  ITL
    (Lane.VOICE,        8192,   256,         1024,    16,     15.0,      None,    0.5,  0.1),
    (Lane.INTERACTIVE,  8192,   512,         2048,    32,     60.0,      None,    1.0,  0.15),
    (Lane.AUTOMATION,   8192,   512,         2048,    64,     300.0,     None,    5.0,  0.25),
    (Lane.BACKGROUND,   16384,  1024,        4096,    256,    6 * 3600.0, None,   60.0, 1.0),
)  # fmt: skip

DEFAULT_LANE_LIMITS: dict[Lane, LaneLimits] = {
    lane: LaneLimits(
        max_prompt_tokens=prompt,
        default_output_tokens=default_output,
        max_output_tokens=max_output,
        max_queued=queued,
        max_wait_s=wait,
        max_concurrency=streams,
        ttft_slo_s=ttft,
        itl_slo_s=itl,
    )
    for lane, prompt, default_output, max_output, queued, wait, streams, ttft, itl in _DEFAULTS
}
"""The limits and objectives of each lane when the user has set none."""
