"""The simulated model's deterministic answers."""

from __future__ import annotations

from tools.simulator.answers import (
    SimMessage,
    SimTool,
    count_prompt_tokens,
    plan_answer,
)

LIGHT = SimTool(
    name="HassTurnOn",
    parameters={
        "type": "object",
        "properties": {"name": {"type": "string"}, "brightness": {"type": "integer"}},
    },
)


def _plan(messages: list[SimMessage], **kwargs: object) -> list[str]:
    options: dict[str, object] = {
        "seed": 1, "tools": [], "max_tokens": None, "ignore_eos": False,
        "json_schema": None, "context_left": 4096,
    } | kwargs  # fmt: skip
    return plan_answer(messages=messages, **options).pieces  # type: ignore[arg-type]


def test_same_conversation_same_answer() -> None:
    """The answer depends on the conversation and the seed only."""
    messages = [SimMessage("user", "what is the temperature")]
    assert _plan(messages) == _plan(messages)
    assert _plan(messages) != _plan(messages, seed=2)
    assert 12 <= len(_plan(messages)) <= 60


def test_ignore_eos_gives_exactly_max_tokens() -> None:
    """With ignore_eos the model produces max_tokens tokens, as llama.cpp does."""
    plan = plan_answer(
        seed=0, messages=[SimMessage("user", "hi")], tools=[], max_tokens=300,
        ignore_eos=True, json_schema=None, context_left=4096,
    )  # fmt: skip
    assert len(plan.pieces) == 300
    assert plan.finish_reason == "length"


def test_resume_continues_the_interrupted_answer() -> None:
    """Sending the first part back as an assistant message yields exactly the rest."""
    user = [SimMessage("user", "summarize the day")]
    whole = _plan(user, max_tokens=40, ignore_eos=True)
    prefix = "".join(whole[:15])
    rest = _plan(
        [*user, SimMessage("assistant", prefix)], max_tokens=25, ignore_eos=True
    )
    assert prefix + "".join(rest) == "".join(whole)


def test_tool_named_in_the_message_is_called_with_its_arguments() -> None:
    """key=value pairs that match the tool's parameters become its arguments."""
    plan = plan_answer(
        seed=0,
        messages=[SimMessage("user", 'please HassTurnOn name="Kitchen light" brightness=40 colour=red')],
        tools=[LIGHT], max_tokens=None, ignore_eos=False, json_schema=None, context_left=4096,
    )  # fmt: skip
    assert plan.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in plan.tool_calls] == [
        ("HassTurnOn", {"name": "Kitchen light", "brightness": 40})
    ]
    assert not "".join(plan.pieces)
    after = _plan(
        [
            SimMessage("user", "HassTurnOn name=x"),
            SimMessage("assistant", "", ({"id": "c"},)),
            SimMessage("tool", "{}"),
        ],
        tools=[LIGHT],
    )
    assert after == ["Done."]


def test_no_tool_named_means_text() -> None:
    """Without a tool's name in the message the model answers in text."""
    plan = plan_answer(
        seed=0, messages=[SimMessage("user", "turn on the kitchen light")], tools=[LIGHT],
        max_tokens=None, ignore_eos=False, json_schema=None, context_left=4096,
    )  # fmt: skip
    assert not plan.tool_calls
    assert plan.pieces


def test_json_schema_answer_matches_the_schema() -> None:
    """Structured output is the smallest document that fits the schema."""
    import json  # noqa: PLC0415

    schema = {
        "type": "object",
        "properties": {
            "mood": {"enum": ["calm", "busy"]},
            "count": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["mood", "count", "tags"],
    }
    text = "".join(_plan([SimMessage("user", "describe")], json_schema=schema))
    value = json.loads(text)
    assert value["mood"] == "calm"
    assert isinstance(value["count"], int)
    assert len(value["tags"]) == 1


def test_prompt_token_count() -> None:
    """Four characters a token plus four per message for the template."""
    assert (
        count_prompt_tokens(
            [SimMessage("system", "x" * 40), SimMessage("user", "y" * 9)], []
        )
        == 14 + 7
    )


def test_home_assistant_tool_is_called_by_either_name() -> None:
    """Assist names its tools ``intent__HassTurnOn``: a message may say that or ``HassTurnOn``."""
    tools = [
        SimTool(name="intent__HassTurnOff", parameters=LIGHT.parameters),
        SimTool(name="intent__HassTurnOn", parameters=LIGHT.parameters),
    ]
    for text in (
        'intent__HassTurnOn name="Kitchen light"',
        'HassTurnOn name="Kitchen light"',
    ):
        plan = plan_answer(
            seed=0, messages=[SimMessage("user", text)], tools=tools, max_tokens=None,
            ignore_eos=False, json_schema=None, context_left=4096,
        )  # fmt: skip
        assert [(c.name, c.arguments) for c in plan.tool_calls] == [
            ("intent__HassTurnOn", {"name": "Kitchen light"})
        ], text
    # A longer word that contains the name does not call it.
    plan = plan_answer(
        seed=0, messages=[SimMessage("user", "HassTurnOnAll name=x")], tools=tools,
        max_tokens=None, ignore_eos=False, json_schema=None, context_left=4096,
    )  # fmt: skip
    assert not plan.tool_calls
