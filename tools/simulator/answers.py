"""What the simulated model says: deterministic token counts, text, tool calls and JSON.

Rules (documented for tests and demos):

* **Prompt tokens**: every message counts ``ceil(len(content) / 4)`` tokens plus 4 for the chat
  template; tool definitions count ``ceil(len(json) / 4)``.
* **Text**: the answer is a sequence of words, one token each, drawn from a small vocabulary by a
  generator seeded with the server's seed and a SHA-256 of the conversation (the messages
  before any final assistant message). The same conversation always gets the same answer.
* **Length**: ``max_tokens`` when the request sets ``ignore_eos`` (llama.cpp's option, at the top
  level or in Ollama's ``options``); otherwise the model "stops" after a natural length of 12-60
  tokens drawn from the same generator, or at ``max_tokens`` if that comes first.
* **Resume**: when the last message is an assistant message, the answer continues it: the
  words already there are skipped, so prefix + continuation equals the uninterrupted answer.
* **Tools**: when tools are offered and the last message is a user message that names one of
  them (case-insensitive, as a whole word), the model calls that tool; its arguments are the
  ``key=value`` pairs of the message whose key is a parameter of the tool (values may be
  double-quoted; numbers, ``true``/``false`` are parsed as JSON). Example:
  ``HassTurnOn name="Kitchen light"`` calls ``HassTurnOn({"name": "Kitchen light"})``.
  When the last message is a tool result, the answer is ``Done.``.
* **Structured output**: with a JSON schema the answer is the smallest JSON document that
  matches it (required properties, first enum value, deterministic strings and numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import hashlib
import json
import math
import random
import re
from typing import Any

from custom_components.llm_lanes.core.model import ToolCall

VOCABULARY = [
    "the",
    "light",
    "is",
    "on",
    "in",
    "kitchen",
    "and",
    "living",
    "room",
    "lamp",
    "off",
    "warm",
    "cool",
    "door",
    "locked",
    "open",
    "garage",
    "window",
    "sensor",
    "motion",
    "detected",
    "temperature",
    "degrees",
    "humidity",
    "percent",
    "today",
    "tomorrow",
    "morning",
    "evening",
    "night",
    "rain",
    "sun",
    "cloudy",
    "wind",
    "calendar",
    "meeting",
    "reminder",
    "music",
    "playing",
    "volume",
    "scene",
    "ready",
    "done",
    "okay",
    "sure",
    "here",
    "summary",
    "of",
    "your",
    "home",
    "energy",
    "used",
    "kilowatt",
    "hours",
    "battery",
    "charged",
    "solar",
    "power",
    "water",
    "heater",
    "thermostat",
    "set",
    "to",
]

_ARG_RE = re.compile(r"""(\w+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]+)""")


def count_text_tokens(text: str) -> int:
    """Tokens of a piece of text: one per four characters, rounded up."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True, slots=True)
class SimMessage:
    """A chat message as the simulator sees it (either API)."""

    role: str
    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class SimTool:
    """A tool offered in a request."""

    name: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class AnswerPlan:
    """Everything the server will stream for one request."""

    pieces: list[str]
    """Text of each output token ('' for the tokens of a tool call)."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """The tool calls the model makes (their tokens are the empty pieces)."""
    finish_reason: str = "stop"


def count_prompt_tokens(messages: list[SimMessage], tools: list[SimTool]) -> int:
    """Prompt tokens of a chat request (see the module rules)."""
    total = 0
    for message in messages:
        total += 4 + count_text_tokens(message.content)
        for call in message.tool_calls:
            total += count_text_tokens(json.dumps(call, sort_keys=True))
    for tool in tools:
        total += count_text_tokens(
            json.dumps(
                {"name": tool.name, "parameters": tool.parameters}, sort_keys=True
            )
        )
    return max(1, total)


def render_prompt(messages: list[SimMessage], tools: list[SimTool]) -> str:
    """Render the prompt as the model reads it (for the prompt cache): tools, messages, answer.

    A final assistant message is the beginning of the answer (a resumed one), left open; otherwise
    the prompt ends where the answer begins. So an answer's prompt plus the text it produced is a
    prefix of the prompt that resumes it or of the conversation's next turn.
    """
    parts = [
        json.dumps({"name": tool.name, "parameters": tool.parameters}, sort_keys=True)
        for tool in tools
    ]
    for index, message in enumerate(messages):
        parts.extend((f"\x00{message.role}\x00", message.content))
        parts.extend(json.dumps(call, sort_keys=True) for call in message.tool_calls)
        if index < len(messages) - 1 or message.role != "assistant":
            parts.append("\x00end\x00")
    if not messages or messages[-1].role != "assistant":
        parts.append("\x00assistant\x00")
    return "".join(parts)


def _conversation_rng(seed: int, messages: list[SimMessage]) -> random.Random:
    digest = hashlib.sha256(str(seed).encode())
    for message in messages:
        digest.update(message.role.encode() + b"\0" + message.content.encode() + b"\0")
    return random.Random(int.from_bytes(digest.digest()[:8], "big"))


def plan_answer(
    *,
    seed: int,
    messages: list[SimMessage],
    tools: list[SimTool],
    max_tokens: int | None,
    ignore_eos: bool,
    json_schema: dict[str, Any] | None,
    context_left: int,
) -> AnswerPlan:
    """Decide what the simulated model answers (deterministic; see the module rules)."""
    prefix = ""
    history = messages
    if messages and messages[-1].role == "assistant" and not messages[-1].tool_calls:
        prefix = messages[-1].content
        history = messages[:-1]
    rng = _conversation_rng(seed, history)
    limit = min(max_tokens if max_tokens is not None else context_left, context_left)
    last = history[-1] if history else None

    if last is not None and tools and last.role == "user" and not prefix:
        call = _tool_call(last.content, tools, rng)
        if call is not None:
            size = max(1, count_text_tokens(json.dumps(call.arguments)) + 4)
            return AnswerPlan(
                pieces=[""] * size, tool_calls=[call], finish_reason="tool_calls"
            )

    if last is not None and last.role == "tool" and not prefix:
        return _clip(["Done."], limit)

    if json_schema is not None and not prefix:
        text = json.dumps(_value_for(json_schema, rng))
        return _clip([text[i : i + 4] for i in range(0, len(text), 4)], limit)

    natural = rng.randint(12, 60)
    skip = len(prefix.split())
    # Words are drawn in order, so word i is the same whatever the length: a resumed answer
    # continues exactly where the interrupted one stopped.
    words = [
        rng.choice(VOCABULARY) for _ in range(skip + limit if ignore_eos else natural)
    ]
    new = words[skip:]
    finish_reason = "length" if ignore_eos else "stop"
    if len(new) > limit:
        new = new[:limit]
        finish_reason = "length"
    pieces = [(" " if i > 0 or prefix else "") + word for i, word in enumerate(new)]
    return AnswerPlan(pieces=pieces, finish_reason=finish_reason)


def _clip(pieces: list[str], limit: int) -> AnswerPlan:
    if len(pieces) > limit:
        return AnswerPlan(pieces=pieces[:limit], finish_reason="length")
    return AnswerPlan(pieces=pieces)


def _tool_call(text: str, tools: list[SimTool], rng: random.Random) -> ToolCall | None:
    """Call the first tool the message names, by its full name or the part after ``__``.

    Home Assistant names its tools ``<namespace>__<name>`` (``intent__HassTurnOn``); a message
    may say either. Word boundaries there are ``_``-free: ``HassTurnOn`` inside
    ``intent__HassTurnOn`` counts as named.
    """
    lowered = text.lower()
    for tool in tools:
        names = {tool.name.lower(), tool.name.rpartition("__")[2].lower()}
        if not any(
            re.search(rf"(?<![^\W_]){re.escape(name)}(?![^\W_])", lowered)
            for name in names
        ):
            continue
        properties = tool.parameters.get("properties", {})
        arguments: dict[str, Any] = {}
        for key, raw in _ARG_RE.findall(text):
            if key not in properties or key.lower() in names:
                continue
            if raw.startswith('"'):
                arguments[key] = json.loads(raw)
                continue
            try:
                arguments[key] = json.loads(raw)
            except ValueError:
                arguments[key] = raw
        return ToolCall(
            id=f"call_{rng.getrandbits(32):08x}", name=tool.name, arguments=arguments
        )
    return None


def _value_for(schema: dict[str, Any], rng: random.Random) -> Any:
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties: dict[str, Any] = schema.get("properties", {})
        required = schema.get("required", list(properties))
        return {key: _value_for(properties.get(key, {}), rng) for key in required}
    if kind == "array":
        return [_value_for(schema.get("items", {}), rng)] * max(
            1, schema.get("minItems", 1)
        )
    if kind == "string":
        return " ".join(rng.choice(VOCABULARY) for _ in range(3))
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return True
    return None
