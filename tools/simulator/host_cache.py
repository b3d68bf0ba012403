"""llama-server's host-memory prompt cache, as the simulator's engine keeps it.

Entries are saved prompts (the rendered text and its tokens), oldest first. Saving a prompt the
cache already holds whole (an entry starts with it) is skipped; a saved prompt drops the entries it
contains; past ``capacity_tokens`` the oldest entries are removed (llama-server's "making room for
prompt cache entry, removing oldest entry"). A load takes the entry sharing the longest prefix with
a new prompt out of the cache and into the slot.
"""

from __future__ import annotations

from dataclasses import dataclass


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass(slots=True)
class Entry:
    """One saved prompt."""

    text: str
    tokens: int


class HostCache:
    """Saved prompts in host memory, at most ``capacity_tokens`` of them (see the module docstring)."""

    def __init__(self, capacity_tokens: int) -> None:
        """Start empty."""
        self.capacity_tokens = capacity_tokens
        self.entries: list[Entry] = []
        """Oldest first."""
        self.evicted = 0

    @property
    def tokens(self) -> int:
        """Tokens held now."""
        return sum(entry.tokens for entry in self.entries)

    def holds(self, text: str) -> bool:
        """Whether an entry holds ``text`` whole (a save of it would be skipped)."""
        return any(entry.text.startswith(text) for entry in self.entries)

    def save(self, text: str, tokens: int) -> bool:
        """Save a slot's content; False when it was held already (nothing copied)."""
        if not text or tokens <= 0 or self.holds(text):
            return False
        self.entries = [
            entry for entry in self.entries if not text.startswith(entry.text)
        ]
        self.entries.append(Entry(text, tokens))
        while len(self.entries) > 1 and self.tokens > self.capacity_tokens:
            self.entries.pop(0)
            self.evicted += 1
        if self.tokens > self.capacity_tokens:
            self.entries.clear()
            self.evicted += 1
            return False
        return True

    def best(self, text: str) -> tuple[Entry, int] | None:
        """Return the entry sharing the longest prefix with ``text`` (and that length), if any."""
        found: tuple[Entry, int] | None = None
        for entry in self.entries:
            shared = common_prefix(text, entry.text)
            if shared and (found is None or shared > found[1]):
                found = (entry, shared)
        return found

    def take(self, entry: Entry) -> None:
        """Remove ``entry``: it was loaded into a slot (llama-server moves it there)."""
        self.entries.remove(entry)
