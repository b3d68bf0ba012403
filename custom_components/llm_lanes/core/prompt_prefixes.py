"""What a prompt shares with others: the digests slot placement and routing match it by.

Below both the slot table (``slots.py``, which computes them: ``prefix_keys``) and the ticket that
carries a request's keys (``ticket.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixKeys:
    """Digests of the parts of a prompt that recur: the stable prefix and the conversation."""

    stable: str | None
    """System messages and tool schemas (the Assist prompt); None when the request has none."""
    conversation: str | None
    """The stable prefix plus the conversation's first user message (a chat's later turns)."""
    stable_tokens: int = 0
    """The stable prefix's length (estimated tokens)."""
