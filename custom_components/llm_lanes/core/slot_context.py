"""What one request may hold at a server slot, and when a slot is too small for a household.

A server splits its context between its slots: llama.cpp's ``--ctx-size`` is shared by its
``--parallel`` slots, so its default context with ``--parallel 4`` leaves 1,024 tokens to each
request, prompt and answer together. Home Assistant's Assist prompt (its instructions, the exposed
entities and the tool schemas) is 1,500 to 3,000 tokens on its own, so a slot below
``MIN_CONTEXT_PER_SLOT`` cannot hold what a household sends: the set-up warns, a repair says what
to change for the kind of server, and until then every limit is sized to the slot:

- a lane's default answer reserves at most ``1 / ANSWER_SHARE`` of the slot, so a prompt always
  has room beside it (``default_answer_tokens``);
- a request whose prompt and answer exceed the slot is refused before it is sent (``fits``);
- the benchmark scales its prompts and answers to ``BENCH_FILL`` of the slot.
"""

from __future__ import annotations

from typing import Final

MIN_CONTEXT_PER_SLOT: Final = 4096
"""Below this many tokens a slot, the server cannot hold Assist's prompt beside an answer."""
RECOMMENDED_CONTEXT_PER_SLOT: Final = 8192
"""What the repair recommends: Assist's prompt with many exposed entities, and its answer."""
ANSWER_SHARE: Final = 4
"""A lane's default answer reserves at most a quarter of the slot (a 1,024-token slot: 256)."""
BENCH_FILL: Final = 0.8
"""The share of a slot the benchmark's longest prompt and answer fill together: the rest is for
the chat template and for tokenizers that count more tokens than the estimate."""


def is_small(context_per_slot: int | None) -> bool:
    """Whether a slot of this many tokens is too small for Assist (None: the server does not say)."""
    return context_per_slot is not None and 0 < context_per_slot < MIN_CONTEXT_PER_SLOT


def default_answer_tokens(default: int, context_per_slot: int | None) -> int:
    """Return ``default`` output tokens, or less: at most ``1 / ANSWER_SHARE`` of the slot."""
    if context_per_slot is None or context_per_slot <= 0:
        return default
    return max(1, min(default, context_per_slot // ANSWER_SHARE))


def fits(prompt_tokens: int, output_tokens: int, context_per_slot: int | None) -> bool:
    """Whether a prompt and its answer fit one slot (always, where the server does not say)."""
    return (
        context_per_slot is None
        or context_per_slot <= 0
        or prompt_tokens + output_tokens <= context_per_slot
    )
