r"""The Prometheus text exposition format (version 0.0.4), read line by line.

What llama.cpp (``--metrics``) and vLLM (through ``prometheus_client``) serve at ``/metrics``,
as https://prometheus.io/docs/instrumenting/exposition_formats/ describes it:

- a sample line: ``name{label="value",...} value [timestamp]``, the labels optional (a trailing
  comma allowed), label values escaped with ``\\``, ``\"`` and ``\n``; the value a float
  (``NaN``, ``+Inf`` and ``-Inf`` included), the timestamp whole milliseconds;
- ``# TYPE name type`` (counter, gauge, histogram, summary or untyped) and ``# HELP name text``;
- any other line starting with ``#`` is a comment; blank lines are nothing.

A page that breaks the format raises ``MalformedStreamError`` naming the line: its figures cannot
be trusted, and a server that writes it is broken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
import re

from custom_components.llm_lanes.core.errors import MalformedStreamError

METRIC_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*'
)
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: the metric's name, its labels and its value."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Exposition:
    """A whole page: its samples in order, and the types its ``# TYPE`` lines declare."""

    samples: tuple[Sample, ...]
    types: Mapping[str, str] = field(default_factory=dict)


class _LineError(ValueError):
    """What is wrong with one line (``parse`` adds where)."""


def parse(text: str) -> Exposition:
    """Read a page; raise ``MalformedStreamError`` at the first line that breaks the format."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    # Only "\n" ends a line: a label value may hold any other line separator unescaped.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r").strip(" \t")
        try:
            if line.startswith("#"):
                _read_comment(line, types)
            elif line:
                samples.append(_read_sample(line))
        except _LineError as err:
            raise MalformedStreamError(
                "the metrics are not in the Prometheus text format: "
                f"line {number}: {err}: {line[:100]!r}"
            ) from None
    return Exposition(samples=tuple(samples), types=types)


def _read_comment(line: str, types: dict[str, str]) -> None:
    """Check a ``# TYPE`` or ``# HELP`` line and keep the type; other comments say nothing."""
    words = line[1:].split(None, 2)
    if not words or words[0] not in ("TYPE", "HELP"):
        return
    if len(words) < 2 or not _METRIC_NAME.fullmatch(words[1]):
        raise _LineError(f"{words[0]} without a valid metric name")
    if words[0] == "TYPE":
        kind = words[2].strip() if len(words) == 3 else ""
        if kind not in METRIC_TYPES:
            raise _LineError(f"unknown metric type {kind!r}")
        types[words[1]] = kind


def _read_sample(line: str) -> Sample:
    name = _METRIC_NAME.match(line)
    if name is None:
        raise _LineError("no metric name")
    position = name.end()
    labels: dict[str, str] = {}
    if line.startswith("{", position):
        position = _read_labels(line, position + 1, labels)
    rest = line[position:]
    if rest[:1] not in (" ", "\t"):
        raise _LineError("no value after the metric name and labels")
    words = rest.split()
    if len(words) not in (1, 2):
        raise _LineError("expected a value and at most a timestamp")
    try:
        value = float(words[0])
        timestamp = int(words[1]) if len(words) == 2 else None
    except ValueError:
        raise _LineError("a value or timestamp that is not a number") from None
    return Sample(name.group(), labels, value, timestamp)


def _read_labels(line: str, position: int, labels: dict[str, str]) -> int:
    """Read the labels after ``{`` into ``labels``; return the position after ``}``."""
    while True:
        position = _skip_blanks(line, position)
        if line.startswith("}", position):
            return position + 1
        label = _LABEL.match(line, position)
        if label is None:
            raise _LineError('a label that is not name="value"')
        if label[1] in labels:
            raise _LineError(f"label {label[1]!r} twice")
        labels[label[1]] = _ESCAPE.sub(_unescape, label[2])
        position = label.end()
        if line.startswith(",", position):
            position += 1
        elif not line.startswith("}", position):
            raise _LineError("labels not separated by commas or not closed")


def _skip_blanks(line: str, position: int) -> int:
    while line.startswith((" ", "\t"), position):
        position += 1
    return position


def _unescape(escape: re.Match[str]) -> str:
    if (character := _UNESCAPED.get(escape[1])) is None:
        raise _LineError(f"unknown escape \\{escape[1]} in a label value")
    return character
