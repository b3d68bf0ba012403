"""What detection asks a server, as data: a probe is one GET and what its answer must hold.

A kind's description (``kinds.ServerProfile.detection``) lists its evidence: every probe of one
piece of evidence must match, and any one piece tells the kind. ``detect.py`` sends the probes
(each endpoint once) and hands the answers to ``Match.matches``; nothing here speaks HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


class Match(Protocol):
    """What an answer must hold for its probe to match."""

    reads_text: ClassVar[bool]
    """Whether the answer is read as text (else as a JSON document)."""

    def matches(self, answer: Any) -> bool:
        """Tell whether the answer (a JSON document, or the text) holds it."""


@dataclass(frozen=True, slots=True)
class HasKey:
    """A JSON object holding one of ``keys``."""

    keys: tuple[str, ...]
    reads_text: ClassVar[bool] = False

    def matches(self, answer: Any) -> bool:
        """Tell whether the document is an object with one of the keys."""
        return isinstance(answer, dict) and any(key in answer for key in self.keys)


@dataclass(frozen=True, slots=True)
class ListsEntries:
    """A JSON object whose ``list_key`` is a list (of models, say).

    With ``key``, one of its entries must hold that key; with ``value`` too, hold it with that
    value.
    """

    list_key: str = "data"
    key: str | None = None
    value: str | None = None
    reads_text: ClassVar[bool] = False

    def matches(self, answer: Any) -> bool:
        """Tell whether the document lists such an entry."""
        entries = answer.get(self.list_key) if isinstance(answer, dict) else None
        if not isinstance(entries, list):
            return False
        if self.key is None:
            return True
        return any(
            isinstance(entry, dict)
            and self.key in entry
            and (self.value is None or entry[self.key] == self.value)
            for entry in entries
        )


@dataclass(frozen=True, slots=True)
class TextHas:
    """A text answer (Prometheus metrics, say) that contains ``text``."""

    text: str
    reads_text: ClassVar[bool] = True

    def matches(self, answer: Any) -> bool:
        """Tell whether the text contains it."""
        return isinstance(answer, str) and self.text in answer


@dataclass(frozen=True, slots=True)
class Probe:
    """One GET of ``path``, and what its answer must hold."""

    path: str
    match: Match


type Evidence = tuple[Probe, ...]
"""Probes that together tell a kind: all of them must match (they are sent in order, and the
first that does not match ends the evidence)."""
