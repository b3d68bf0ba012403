"""How a server counts a request's prompt before it runs: with its own chat template and tokenizer.

A kind's description (``kinds.ServerProfile.counts_prompts``) names its counter, or None where
the server documents no endpoint that applies the chat template:

- llama.cpp ``llama-server``: ``POST /apply-template`` renders the messages (tools included) as
  ``/v1/chat/completions`` does, then ``POST /tokenize`` with ``add_special`` tokenizes the text
  as a chat's prompt is tokenized. The count is what its ``usage.prompt_tokens`` will say.
- vLLM: ``POST /tokenize`` takes the chat's messages and tools, applies the template and answers
  the ``count``.
- Ollama (its API has no tokenizer endpoint), LM Studio (it counts only through its SDK) and
  LocalAI (its ``/v1/tokenize`` counts raw text, without the template) cannot count: the
  scheduler bounds their prompts instead (``core.quota_prompts``).

Embeddings are not counted (None).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from custom_components.llm_lanes.core.backends.transport import HttpClient
from custom_components.llm_lanes.core.errors import BackendError
from custom_components.llm_lanes.core.model import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
)
from custom_components.llm_lanes.core.protocols.openai_requests import chat_body

APPLY_TEMPLATE_PATH = "/apply-template"
TOKENIZE_PATH = "/tokenize"

type PromptCounter = Callable[
    [HttpClient, ChatRequest, Mapping[str, Any]], Awaitable[int | None]
]
"""Counts a request's prompt tokens at the server, given its client, the request and the fields
the server's kind adds to continue an answer (``ServerProfile.resume_fields``)."""


def template_body(
    request: ChatRequest, resume_fields: Mapping[str, Any]
) -> dict[str, Any]:
    """Return a chat's body as the template sees it: messages and tools, nothing streamed."""
    body = chat_body(request, resume_fields if request.assistant_prefix else None)
    for key in ("stream", "stream_options", "max_tokens"):
        body.pop(key, None)
    return body


async def llama_cpp_rendered(
    http: HttpClient, request: ChatRequest, resume_fields: Mapping[str, Any]
) -> str:
    """Return the prompt text llama.cpp's chat template makes of a request (``/apply-template``)."""
    data = await http.request_json(
        "POST",
        APPLY_TEMPLATE_PATH,
        json_body=template_body(request, resume_fields),
        model=request.model,
    )
    prompt = data.get("prompt") if isinstance(data, dict) else None
    if not isinstance(prompt, str):
        raise BackendError(f"{http.url(APPLY_TEMPLATE_PATH)} gave no prompt")
    return prompt


async def llama_cpp_prompt_tokens(
    http: HttpClient, request: ChatRequest, resume_fields: Mapping[str, Any]
) -> int | None:
    """Count as llama.cpp will: the rendered chat (or the raw prompt), special tokens added."""
    if isinstance(request, EmbeddingRequest):
        return None
    text = (
        request.prompt + request.assistant_prefix
        if isinstance(request, CompletionRequest)
        else await llama_cpp_rendered(http, request, resume_fields)
    )
    data = await http.request_json(
        "POST",
        TOKENIZE_PATH,
        json_body={"content": text, "add_special": True, "parse_special": True},
        model=request.model,
    )
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list):
        raise BackendError(f"{http.url(TOKENIZE_PATH)} gave no tokens")
    return len(tokens)


async def vllm_prompt_tokens(
    http: HttpClient, request: ChatRequest, resume_fields: Mapping[str, Any]
) -> int | None:
    """Count as vLLM will: its ``/tokenize`` applies the chat template to messages and tools."""
    if isinstance(request, EmbeddingRequest):
        return None
    body: dict[str, Any] = {"model": request.model}
    if isinstance(request, CompletionRequest):
        body["prompt"] = request.prompt + request.assistant_prefix
    else:
        chat = template_body(request, resume_fields)
        body["messages"] = chat["messages"]
        if "tools" in chat:
            body["tools"] = chat["tools"]
        if request.assistant_prefix:
            body.update(resume_fields)
    data = await http.request_json(
        "POST",
        TOKENIZE_PATH,
        json_body=body,
        model=request.model,
    )
    count = data.get("count") if isinstance(data, dict) else None
    if not isinstance(count, int) or isinstance(count, bool):
        raise BackendError(f"{http.url(TOKENIZE_PATH)} gave no count")
    return count
