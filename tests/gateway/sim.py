"""The simulated server, plus the endpoints the gateway uses beyond chat.

``tools.simulator.server`` serves chat only. For the gateway's raw completions and embeddings, this
subclass adds ``/v1/completions`` and ``/v1/embeddings`` (llama.cpp kind) or ``/api/generate``
(``raw``) and ``/api/embed`` (Ollama kind), run through the same engine (slots, timing,
cancellation). An embedding is a deterministic vector of the text, so a test can check that each
input got its own.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from aiohttp import web

from tools.simulator.answers import SimMessage, count_prompt_tokens, plan_answer
from tools.simulator.server import SimulatedServer

DIMENSIONS = 8


def embedding_of(text: str) -> list[float]:
    """Return the simulated embedding of ``text``: its hash, as numbers in [0, 1)."""
    digest = hashlib.sha256(text.encode()).digest()
    return [byte / 256 for byte in digest[:DIMENSIONS]]


class GatewaySim(SimulatedServer):
    """A simulated server that also does raw completions and embeddings."""

    def _add_routes(self, app: web.Application) -> None:
        super()._add_routes(app)
        if self.config.kind == "ollama":
            app.add_routes(
                [
                    web.post("/api/generate", self._generate),
                    web.post("/api/embed", self._embed),
                ]
            )
        else:
            app.add_routes(
                [
                    web.post("/v1/completions", self._generate),
                    web.post("/v1/embeddings", self._embed),
                ]
            )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests_seen.append(body)
        ollama = self.config.kind == "ollama"
        prompt = str(body["prompt"])
        messages = [SimMessage(role="user", content=prompt)]
        prompt_tokens = count_prompt_tokens(messages, [])
        max_tokens = (
            (body.get("options") or {}).get("num_predict")
            if ollama
            else body.get("max_tokens")
        )
        plan = plan_answer(
            seed=self.config.seed,
            messages=messages,
            tools=[],
            max_tokens=max_tokens,
            ignore_eos=False,
            json_schema=None,
            context_left=self.config.context_per_slot - prompt_tokens,
        )
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/x-ndjson"
                if ollama
                else "text/event-stream"
            }
        )
        await response.prepare(request)

        async def send(event: dict[str, Any] | str) -> None:
            data = event if isinstance(event, str) else json.dumps(event)
            await response.write(
                f"{data}\n".encode() if ollama else f"data: {data}\n\n".encode()
            )

        def event(text: str, finish: str | None) -> dict[str, Any]:
            if ollama:
                return {"model": self.config.model, "response": text, "done": False}
            return {
                "object": "text_completion",
                "model": self.config.model,
                "choices": [{"index": 0, "text": text, "finish_reason": finish}],
            }

        try:
            seq = self.engine.submit(
                prompt_tokens, len(plan.pieces), pieces=tuple(plan.pieces)
            )
            async for piece in self._run(seq, plan):
                await send(event(piece, None))
            if ollama:
                final = event("", None) | {
                    "done": True,
                    "done_reason": plan.finish_reason,
                    "prompt_eval_count": prompt_tokens,
                    "eval_count": len(plan.pieces),
                }
                await send(final)
            else:
                await send(event("", plan.finish_reason))
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(plan.pieces),
                }
                await send({"choices": [], "usage": usage})
                await send("[DONE]")
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; the engine freed the slot
        return response

    async def _embed(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests_seen.append(body)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        tokens = sum(
            count_prompt_tokens([SimMessage(role="user", content=text)], [])
            for text in inputs
        )
        started = time.monotonic_ns()
        # One engine step for the batch: embeddings take a slot too.
        plan = plan_answer_of_one()
        async for _ in self._run(self.engine.submit(tokens, len(plan.pieces)), plan):
            pass
        vectors = [embedding_of(text) for text in inputs]
        if self.config.kind == "ollama":
            return web.json_response(
                {
                    "model": self.config.model,
                    "embeddings": vectors,
                    "total_duration": time.monotonic_ns() - started,
                    "prompt_eval_count": tokens,
                }
            )
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": index, "embedding": vector}
                    for index, vector in enumerate(vectors)
                ],
                "model": self.config.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )


def plan_answer_of_one() -> Any:
    """Plan one empty token: the engine prefills the inputs and is done."""
    return plan_answer(
        seed=0,
        messages=[SimMessage(role="user", content="")],
        tools=[],
        max_tokens=1,
        ignore_eos=True,
        json_schema=None,
        context_left=1,
    )
