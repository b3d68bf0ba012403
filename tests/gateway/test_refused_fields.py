"""Fields a real llama-server would refuse are refused at the gateway, before they take a slot.

A JSON schema it cannot build a grammar from (an unknown ``type``, a ``$ref`` to nothing), a
``tool_choice`` it does not know: 400 naming the field, in each API's shape, nothing queued.
Embeddings from a server started without ``--embeddings`` (the session's is): 501 saying what
to change, not a bad gateway.
"""

from __future__ import annotations

from typing import Any

import ollama
import openai
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tests.support.llamacpp import LlamaServer
from tests.support.requests import finished_requests

from .conftest import Gateway
from .samples import LIGHTS

pytestmark = pytest.mark.llamacpp

HELLO: list[Any] = [{"role": "user", "content": "Which room?"}]
DANGLING: dict[str, Any] = {
    "type": "object",
    "properties": {"room": {"$ref": "#/$defs/room"}},
}
"""A schema whose reference points at nothing (it has no ``$defs``)."""
RESOLVED: dict[str, Any] = {
    **DANGLING,
    "$defs": {"room": {"type": "string", "enum": ["kitchen", "hall"]}},
    "required": ["room"],
}


def json_schema(schema: dict[str, Any]) -> Any:
    """Return OpenAI's ``response_format`` asking for ``schema``."""
    return {"type": "json_schema", "json_schema": {"name": "room", "schema": schema}}


async def test_openai_fields_refused_before_the_queue(
    gateway: Gateway, llama_entry: MockConfigEntry, llama_server: LlamaServer
) -> None:
    """A dangling ``$ref``, an unknown ``tool_choice`` or tool: 400 naming it; a good one answers."""
    model = llama_server.model_name
    _, api = await gateway.add_openai_client(llama_entry)
    finished = finished_requests(llama_entry)

    with pytest.raises(openai.BadRequestError) as dangling:
        await api.chat.completions.create(
            model=model, messages=HELLO, response_format=json_schema(DANGLING)
        )
    assert (
        dangling.value.param
        == "response_format.json_schema.schema.properties.room.$ref"
    )
    assert dangling.value.code == "invalid_value"
    assert "#/$defs/room points at nothing" in dangling.value.message

    with pytest.raises(openai.BadRequestError) as junk:
        await api.chat.completions.create(
            model=model,
            messages=HELLO,
            tools=[LIGHTS],
            tool_choice="junk",  # type: ignore[arg-type]
        )
    assert junk.value.param == "tool_choice"

    with pytest.raises(openai.BadRequestError) as unknown_tool:
        await api.chat.completions.create(
            model=model,
            messages=HELLO,
            tools=[LIGHTS],
            tool_choice={"type": "function", "function": {"name": "HassTurnOff"}},
        )
    assert unknown_tool.value.param == "tool_choice.function.name"
    assert finished == []

    answer = await api.chat.completions.create(
        model=model,
        messages=HELLO,
        response_format=json_schema(RESOLVED),
        tools=[LIGHTS],
        tool_choice="none",
        max_tokens=8,
    )
    assert answer.choices[0].finish_reason in {"stop", "length"}
    assert [request.outcome for request in finished] == ["ok"]


async def test_ollama_format_refused_before_the_queue(
    gateway: Gateway, llama_entry: MockConfigEntry, llama_server: LlamaServer
) -> None:
    """Ollama's ``format``: an unknown type or a dangling ``$ref`` is a 400 naming it."""
    model = llama_server.model_name
    _, api = await gateway.add_ollama_client(llama_entry)
    finished = finished_requests(llama_entry)

    with pytest.raises(ollama.ResponseError) as junk:
        await api.chat(model=model, messages=HELLO, format={"type": "junk"})
    assert junk.value.status_code == 400
    assert junk.value.error.startswith("format.type: must be one of ")

    with pytest.raises(ollama.ResponseError) as dangling:
        await api.generate(model=model, prompt="Which room?", format=DANGLING)
    assert dangling.value.status_code == 400
    assert dangling.value.error.startswith("format.properties.room.$ref: ")
    assert finished == []


async def test_embeddings_of_a_server_without_them_are_501(
    gateway: Gateway, llama_entry: MockConfigEntry, llama_server: LlamaServer
) -> None:
    """The session's llama-server runs without ``--embeddings``: 501 saying to start it with it."""
    model = llama_server.model_name
    client, api = await gateway.add_openai_client(llama_entry)

    with pytest.raises(openai.APIStatusError) as openai_refused:
        await api.embeddings.create(model=model, input="kitchen")
    assert openai_refused.value.status_code == 501
    assert openai_refused.value.code == "embeddings_unsupported"
    assert "--embeddings" in openai_refused.value.message
    assert llama_server.url not in openai_refused.value.message

    with pytest.raises(ollama.ResponseError) as ollama_refused:
        await gateway.ollama(client.api_key).embed(model=model, input="kitchen")
    assert ollama_refused.value.status_code == 501
    assert "--embeddings" in ollama_refused.value.error
