"""The JSON schemas and tool choices a client's request may carry, checked before it is queued."""

from __future__ import annotations

from typing import Any

import pytest

from custom_components.llm_lanes.core.errors import InvalidRequestError
from custom_components.llm_lanes.core.model import ToolSpec
from custom_components.llm_lanes.core.protocols import ollama_requests, openai_requests
from custom_components.llm_lanes.core.protocols.schemas import (
    check_schema,
    check_tool_choice,
)

HELLO = [{"role": "user", "content": "Hi"}]
LIGHTS = ToolSpec(name="HassTurnOn", description="", parameters={"type": "object"})

GOOD: list[Any] = [
    {},
    {"type": ["string", "null"]},
    {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/a"}, "b": True},
        "$defs": {"a": {"anyOf": [{"type": "integer", "minimum": 0}, {"enum": [1]}]}},
        "required": ["a"],
        "additionalProperties": False,
    },
    {"type": "array", "items": [{"type": "string"}], "minItems": 1},
    {"definitions": {"a/b": {"type": "string"}}, "$ref": "#/definitions/a~1b"},
    {"type": "object", "properties": {"next": {"$ref": "#"}}},
]


@pytest.mark.parametrize("schema", GOOD)
def test_schemas_a_server_can_use_pass(schema: Any) -> None:
    """Types, combinations, local references (escaped, recursive) and booleans are taken."""
    assert check_schema(schema, "format") is schema


@pytest.mark.parametrize(
    ("schema", "field", "problem"),
    [
        ("json", "format", "must be a JSON schema"),
        ({"type": "junk"}, "format.type", "must be one of"),
        ({"type": []}, "format.type", "must be one of"),
        (
            {"properties": {"a": {"$ref": "#/$defs/a"}}},
            "format.properties.a.$ref",
            "#/$defs/a points at nothing",
        ),
        (
            {"$ref": "https://example.com/room.json"},
            "format.$ref",
            "must point inside the schema",
        ),
        ({"$defs": {"a": 3}, "$ref": "#/$defs/a"}, "format.$defs.a", "JSON schema"),
        ({"anyOf": []}, "format.anyOf", "non-empty list"),
        ({"items": [{"type": "nope"}]}, "format.items[0].type", "must be one of"),
        ({"required": "a"}, "format.required", "list of property names"),
        ({"minLength": -1}, "format.minLength", "whole number"),
        ({"maximum": "9"}, "format.maximum", "must be a number"),
        ({"properties": []}, "format.properties", "must map names"),
    ],
)
def test_schemas_a_server_refuses_name_the_part(
    schema: Any, field: str, problem: str
) -> None:
    """Each refusal names the part of the schema (a JSON path under the field) and why."""
    with pytest.raises(InvalidRequestError) as refused:
        check_schema(schema, "format")
    assert refused.value.field == field
    assert problem in refused.value.message


@pytest.mark.parametrize("choice", [None, "none", "auto", "required"])
def test_tool_choices_taken(choice: Any) -> None:
    """The three words, or nothing."""
    check_tool_choice(choice, (LIGHTS,), "tool_choice")


@pytest.mark.parametrize(
    ("choice", "tools", "field"),
    [
        ("junk", (LIGHTS,), "tool_choice"),
        ("required", (), "tool_choice"),
        ({"type": "function"}, (LIGHTS,), "tool_choice"),
        ({"type": "web", "function": {"name": "x"}}, (LIGHTS,), "tool_choice"),
        (
            {"type": "function", "function": {"name": "Other"}},
            (LIGHTS,),
            "tool_choice.function.name",
        ),
    ],
)
def test_tool_choices_refused(choice: Any, tools: Any, field: str) -> None:
    """An unknown word, a function not among the tools, or required without tools."""
    with pytest.raises(InvalidRequestError) as refused:
        check_tool_choice(choice, tools, "tool_choice")
    assert refused.value.field == field


def test_the_parsers_check_every_schema_and_choice() -> None:
    """OpenAI's response_format, tool parameters and tool_choice; Ollama's format."""
    bad = {"type": "junk"}
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (
            openai_requests.parse_chat,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": bad},
                }
            },
            "response_format.json_schema.schema.type",
        ),
        (
            openai_requests.parse_chat,
            {
                "tools": [
                    {"type": "function", "function": {"name": "t", "parameters": bad}}
                ]
            },
            "tools[0].function.parameters.type",
        ),
        (
            openai_requests.parse_chat,
            {"tool_choice": {"type": "function", "function": {"name": "t"}}},
            "tool_choice.function.name",
        ),
        (ollama_requests.parse_chat, {"format": bad}, "format.type"),
        (
            ollama_requests.parse_generate,
            {"prompt": "Hi", "format": bad},
            "format.type",
        ),
    ]
    for parse, fields, field in cases:
        with pytest.raises(InvalidRequestError) as refused:
            parse({"model": "m", "messages": HELLO, **fields})
        assert refused.value.field == field
    parsed = openai_requests.parse_chat(
        {"model": "m", "messages": HELLO, "tool_choice": "auto"}
    )
    assert parsed.request.options == {"tool_choice": "auto"}  # still passed on
