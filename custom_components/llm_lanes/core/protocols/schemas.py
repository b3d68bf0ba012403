"""Checking the JSON schemas and tool choices of a client's request before it is queued.

A server refuses a schema it cannot turn into a grammar (llama.cpp: an unknown ``type``, a
``$ref`` it cannot resolve) and a ``tool_choice`` it does not know, but only once the request
holds a slot. The gateway checks them first and answers 400 naming the field.

The check is structural, what a server needs to build its grammar: every keyword that holds a
schema holds one (an object or true/false), ``type`` names JSON's types, ``required`` lists
names, and every ``$ref`` points inside the schema (``#``, ``#/$defs/...``) at something that is
there. (Home Assistant does not ship the ``jsonschema`` package, so this is not a full
meta-schema validation.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import unquote

from custom_components.llm_lanes.core.errors import InvalidRequestError
from custom_components.llm_lanes.core.model import ToolSpec

TYPES: Final = frozenset(
    {"string", "number", "integer", "boolean", "object", "array", "null"}
)
TOOL_CHOICES: Final = ("none", "auto", "required")

_SCHEMA: Final = frozenset(
    {"items", "additionalProperties", "not", "contains", "propertyNames",
     "additionalItems", "unevaluatedItems", "unevaluatedProperties", "if", "then", "else"}
)  # fmt: skip
"""Keywords whose value is one schema."""
_SCHEMA_LISTS: Final = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
"""Keywords whose value is a non-empty list of schemas."""
_SCHEMA_MAPS: Final = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
"""Keywords whose value maps names to schemas."""
_NUMBERS: Final = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
)
_COUNTS: Final = frozenset(
    {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
)


def check_schema(schema: Any, field: str) -> dict[str, Any]:
    """Return ``schema`` when it is a JSON schema a server can use, else refuse ``field``."""
    if not isinstance(schema, dict):
        raise InvalidRequestError(field, "must be a JSON schema (an object)")
    _check(schema, schema, field)
    return schema


def _check(node: Any, root: dict[str, Any], where: str) -> None:
    if isinstance(node, bool):
        return  # true: anything; false: nothing
    if not isinstance(node, dict):
        raise InvalidRequestError(
            where, "must be a JSON schema (an object or a boolean)"
        )
    for key, value in node.items():
        at = f"{where}.{key}"
        if key == "type":
            _check_type(value, at)
        elif key == "$ref":
            _check_ref(value, root, at)
        elif key == "required":
            if not isinstance(value, list) or not all(
                isinstance(v, str) for v in value
            ):
                raise InvalidRequestError(at, "must be a list of property names")
        elif key == "enum":
            if not isinstance(value, list):
                raise InvalidRequestError(at, "must be a list")
        elif key in _NUMBERS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidRequestError(at, "must be a number")
        elif key in _COUNTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequestError(at, "must be a whole number, 0 or more")
        elif key in _SCHEMA:
            if key == "items" and isinstance(value, list):  # older drafts: a tuple
                _check_all(value, root, at)
            else:
                _check(value, root, at)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list) or not value:
                raise InvalidRequestError(at, "must be a non-empty list of schemas")
            _check_all(value, root, at)
        elif key in _SCHEMA_MAPS:
            if not isinstance(value, dict):
                raise InvalidRequestError(at, "must map names to schemas")
            for name, schema in value.items():
                _check(schema, root, f"{at}.{name}")


def _check_all(schemas: Sequence[Any], root: dict[str, Any], where: str) -> None:
    for index, schema in enumerate(schemas):
        _check(schema, root, f"{where}[{index}]")


def _check_type(value: Any, where: str) -> None:
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(n, str) and n in TYPES for n in names):
        raise InvalidRequestError(
            where, f"must be one of {', '.join(sorted(TYPES))} (or a list of them)"
        )


def _check_ref(ref: Any, root: dict[str, Any], where: str) -> None:
    """Refuse a reference that does not point at a part of the schema itself."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise InvalidRequestError(
            where, "must point inside the schema (#/$defs/...): no other is resolved"
        )
    node: Any = root
    for token in ref[2:].split("/") if ref != "#" else ():
        part = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise InvalidRequestError(where, f"{ref} points at nothing in the schema")
    if not isinstance(node, dict | bool):
        raise InvalidRequestError(where, f"{ref} points at something not a schema")


def check_tool_choice(choice: Any, tools: Sequence[ToolSpec], field: str) -> None:
    """Refuse a ``tool_choice`` that is not none/auto/required or a function among ``tools``."""
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise InvalidRequestError(
                field,
                f"must be {', '.join(TOOL_CHOICES)} or "
                '{"type": "function", "function": {"name": ...}}',
            )
        if choice == "required" and not tools:
            raise InvalidRequestError(field, "required needs tools")
        return
    function = choice.get("function") if isinstance(choice, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
    ):
        raise InvalidRequestError(
            field,
            f"must be {', '.join(TOOL_CHOICES)} or "
            '{"type": "function", "function": {"name": ...}}',
        )
    name = function["name"]
    if name not in {tool.name for tool in tools}:
        raise InvalidRequestError(
            f"{field}.function.name", f"{name!r} is not one of the request's tools"
        )
