"""A simulated LLM server for demos, tests and the benchmark: real HTTP, modelled GPU.

It speaks the OpenAI-compatible API (``/v1/chat/completions`` with SSE and usage, ``/v1/models``)
and either llama.cpp's own endpoints (``/props``, ``/health``, ``/slots``, ``/metrics`` in
llama.cpp's Prometheus format; the default, so the backend detection sees a llama-server) or
Ollama's (``/api/chat`` NDJSON, ``/api/tags``, ``/api/ps``, ``/api/version``, ``/api/show``) with
``kind="ollama"``. Timing comes from :mod:`tools.simulator.engine`, answers from
:mod:`tools.simulator.answers`.

    async with SimulatedServer(SimConfig(slots=4, speed=10)) as sim:
        url = sim.url

Its command line is ``python -m tools.simulator`` (``tools/simulator/__main__.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
import hashlib
import json
import logging
import time
from types import TracebackType
from typing import Any, Literal, Self
import uuid

from aiohttp import web

from tools.simulator.answers import (
    AnswerPlan,
    SimMessage,
    SimTool,
    count_prompt_tokens,
    count_text_tokens,
    plan_answer,
    render_prompt,
)
from tools.simulator.engine import Engine, EngineCosts, Sequence

_LOGGER = logging.getLogger(__name__)

SimKind = Literal["llama_cpp", "ollama"]
SIM_VERSION = "0.1.0-sim"
LLAMA_CPP_BUILD = "b6000-sim"
OLLAMA_VERSION = "0.12.6"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """How the simulated server looks and how fast it is."""

    kind: SimKind = "llama_cpp"
    model: str = "sim-llama-8b"
    quantization: str = "Q4_K_M"
    """The model file's quantization: in llama.cpp's ``model_path`` and Ollama's details (another
    one under the same model name is another model file)."""
    slots: int = 4
    costs: EngineCosts = field(default_factory=EngineCosts)
    prefill_chunk_tokens: int | None = 2048
    """Prompt tokens one iteration may prefill (llama.cpp's default batch is 2,048); None: all."""
    kv_capacity_tokens: int = 32768
    """KV cache size; llama.cpp's ``-c``. Each slot's context is this divided by ``slots``."""
    max_queue: int | None = None
    """Waiting requests beyond this get 503 (Ollama's ``OLLAMA_MAX_QUEUE``); None: unbounded."""
    seed: int = 0
    speed: float = 1.0
    """Time runs this many times faster than the cost model says."""
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port."""

    @property
    def context_per_slot(self) -> int:
        """Context length of one slot (``n_ctx`` of ``/props``)."""
        return self.kv_capacity_tokens // self.slots


@dataclass(slots=True)
class _ParsedChat:
    messages: list[SimMessage]
    tools: list[SimTool]
    max_tokens: int | None
    ignore_eos: bool
    json_schema: dict[str, Any] | None
    stream: bool
    include_usage: bool
    model: str
    slot: int | None = None
    """llama.cpp's ``id_slot`` (-1 or absent: the server picks)."""


@dataclass(slots=True)
class _OpenAIAnswer:
    """One chat completion under way: the OpenAI-format pieces of its answer.

    Usage and timings read the sequence's cached prompt tokens when called, so they say what the
    engine found once the answer has run.
    """

    chat: _ParsedChat
    prompt_tokens: int
    plan: AnswerPlan
    seq: Sequence
    completion_id: str = field(
        default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}"
    )
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        """Return one ``chat.completion.chunk`` event."""
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.chat.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def completion(self, text: str) -> dict[str, Any]:
        """Return the whole ``chat.completion`` of a request that did not stream."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls := self.tool_calls():
            message["tool_calls"] = [
                {k: v for k, v in call.items() if k != "index"} for call in tool_calls
            ]
        return {
            "id": self.completion_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.chat.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": self.plan.finish_reason,
                }
            ],
            "usage": self.usage(),
            "timings": self.timings(),
        }

    def tool_calls(self) -> list[dict[str, Any]]:
        """Return the planned tool calls as the stream's ``tool_calls`` delta (with their index)."""
        return [
            {
                "index": i,
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments),
                },
            }
            for i, call in enumerate(self.plan.tool_calls)
        ]

    def usage(self) -> dict[str, Any]:
        """Return the OpenAI ``usage`` object (cached prompt tokens included)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.plan.pieces),
            "total_tokens": self.prompt_tokens + len(self.plan.pieces),
            "prompt_tokens_details": {"cached_tokens": self.seq.cached_prompt_tokens},
        }

    def timings(self) -> dict[str, Any]:
        """Return llama-server's ``timings`` object (prompt tokens from cache and evaluated)."""
        cached = self.seq.cached_prompt_tokens
        return {
            "cache_n": cached,
            "prompt_n": self.prompt_tokens - cached,
            "predicted_n": len(self.plan.pieces),
        }


class SimulatedServer:
    """The aiohttp application plus its engine; an async context manager."""

    def __init__(self, config: SimConfig | None = None) -> None:
        """Build the server; nothing listens until ``start``."""
        self.config = config or SimConfig()
        self.engine = self._engine()
        self.requests_seen: list[dict[str, Any]] = []
        """Bodies of the chat requests received (for tests)."""
        self.prefills_seen: list[dict[str, Any]] = []
        """Bodies of the prefill-only ``/completion`` requests received (for tests)."""
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._started = time.time()

    def _engine(self) -> Engine:
        return Engine(
            slots=self.config.slots,
            kv_capacity_tokens=self.config.kv_capacity_tokens,
            prefill_chunk_tokens=self.config.prefill_chunk_tokens,
            costs=self.config.costs,
            speed=self.config.speed,
        )

    async def restart(self, **changes: Any) -> None:
        """Stop, then start again on the same port with some of its config changed.

        What an owner does to a real server: another context size (``kv_capacity_tokens``),
        another model file (``quantization``), other slots. Its caches and counters start empty.
        """
        await self.stop()
        self.config = replace(self.config, port=self._port, **changes)
        self.engine = self._engine()
        await self.start()

    @property
    def url(self) -> str:
        """Base URL of the running server."""
        return f"http://{self.config.host}:{self._port}"

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self._port

    async def start(self) -> None:
        """Listen on the configured host and port."""
        self.engine.start()
        app = web.Application()
        self._add_routes(app)
        # handler_cancellation: a client that disconnects cancels its handler, which frees the slot.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        address = self._runner.addresses[0]
        self._port = int(address[1])
        _LOGGER.debug(
            "simulated %s server with %d slots on %s",
            self.config.kind,
            self.config.slots,
            self.url,
        )

    async def kill(self) -> None:
        """Stop as a crash does: every connection is cut at once, then nothing listens.

        A stream under way breaks (its client reads a reset connection, not an end), where
        ``stop`` ends each answer first. ``restart()`` starts it again on the same port.
        """
        if self._runner is not None and self._runner.server is not None:
            for handler in list(self._runner.server.connections):
                if handler.transport is not None:
                    handler.transport.abort()
        await self.stop()

    @property
    def running(self) -> bool:
        """Whether it listens now."""
        return self._runner is not None

    async def stop(self) -> None:
        """Stop listening and end every request."""
        await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        """Start the server."""
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server."""
        await self.stop()

    # --- routes ---------------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        routes: list[web.RouteDef] = [
            web.post("/v1/chat/completions", self._openai_chat),
            web.get("/v1/models", self._openai_models),
        ]
        if self.config.kind == "llama_cpp":
            routes += [
                web.post("/chat/completions", self._openai_chat),
                web.get("/props", self._props),
                web.get("/health", self._health),
                web.get("/slots", self._slots),
                web.get("/metrics", self._metrics),
                web.post("/apply-template", self._apply_template),
                web.post("/completion", self._completion),
            ]
        else:
            routes += [
                web.get("/", self._ollama_root),
                web.post("/api/chat", self._ollama_chat),
                web.get("/api/tags", self._ollama_tags),
                web.get("/api/ps", self._ollama_ps),
                web.get("/api/version", self._ollama_version),
                web.post("/api/show", self._ollama_show),
            ]
        app.add_routes(routes)

    # --- llama.cpp ------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "default_generation_settings": {
                    "n_ctx": self.config.context_per_slot,
                    "params": {
                        "n_predict": -1,
                        "temperature": 0.8,
                        "seed": self.config.seed,
                    },
                },
                "total_slots": self.config.slots,
                "model_path": f"/models/{self.config.model}-{self.config.quantization}.gguf",
                "chat_template": "{{ messages }}",
                "modalities": {"vision": False, "audio": False},
                "build_info": LLAMA_CPP_BUILD,
            }
        )

    async def _slots(self, request: web.Request) -> web.Response:
        table = []
        for index, seq in enumerate(self.engine.slot_table()):
            table.append(
                {
                    "id": index,
                    "id_task": -1 if seq is None else seq.id,
                    "n_ctx": self.config.context_per_slot,
                    "speculative": False,
                    "is_processing": seq is not None,
                    "next_token": {
                        "has_next_token": seq is not None,
                        "n_remain": 0
                        if seq is None
                        else seq.max_new_tokens - seq.generated,
                        "n_decoded": 0 if seq is None else seq.generated,
                    },
                }
            )
        return web.json_response(table)

    async def _metrics(self, request: web.Request) -> web.Response:
        stats = self.engine.stats
        busy_per_decode = (
            stats.busy_slots_sum / stats.decode_iterations_total
            if stats.decode_iterations_total
            else 0.0
        )
        rows: list[tuple[str, str, str, float]] = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", stats.prompt_tokens_total),
            ("prompt_seconds_total", "counter", "Prompt process time", stats.prompt_seconds_total),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed.", stats.tokens_predicted_total),
            ("tokens_predicted_seconds_total", "counter", "Predict process time", stats.tokens_predicted_seconds_total),
            ("n_decode_total", "counter", "Total number of llama_decode() calls", stats.decode_iterations_total),
            ("n_busy_slots_per_decode", "counter", "Average number of busy slots per llama_decode() call", busy_per_decode),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", _rate(stats.prompt_tokens_total, stats.prompt_seconds_total)),
            ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", _rate(stats.tokens_predicted_total, stats.tokens_predicted_seconds_total)),
            ("kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.", self.engine.kv_usage),
            ("kv_cache_tokens", "gauge", "KV-cache tokens.", self.engine.kv_used_tokens),
            ("requests_processing", "gauge", "Number of requests processing.", len(self.engine.running)),
            ("requests_deferred", "gauge", "Number of requests deferred.", len(self.engine.waiting)),
            ("n_preemptions_total", "counter", "Sequences preempted for lack of KV cache (simulator only).", stats.preemptions_total),
        ]  # fmt: skip
        lines: list[str] = []
        for name, kind, help_text, value in rows:
            lines += [
                f"# HELP llamacpp:{name} {help_text}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {_number(value)}",
            ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _apply_template(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        try:
            chat = _parse_openai(body)
        except (KeyError, TypeError, ValueError) as err:
            return _error(400, f"invalid request: {err}", openai=True)
        return web.json_response({"prompt": render_prompt(chat.messages, chat.tools)})

    async def _completion(self, request: web.Request) -> web.Response:
        """Evaluate a raw prompt into a slot's cache (only ``n_predict: 0`` is simulated)."""
        body = await _json_body(request)
        self.prefills_seen.append(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or body.get("n_predict") != 0:
            return _error(
                400, "the simulator only prefills (n_predict: 0)", openai=True
            )
        tokens = max(1, count_text_tokens(prompt))
        seq = self.engine.submit(
            tokens,
            0,
            prompt_text=prompt,
            slot=_slot(body.get("id_slot")),
            prefill_only=True,
        )
        try:
            while await seq.tokens.get() is not None:
                pass
        finally:
            self.engine.cancel(seq)
        evaluated = tokens - seq.cached_prompt_tokens
        costs = self.config.costs
        return web.json_response(
            {
                "content": "",
                "tokens_predicted": 0,
                "tokens_evaluated": tokens,
                "timings": {
                    "cache_n": seq.cached_prompt_tokens,
                    "prompt_n": evaluated,
                    "prompt_ms": 1000 * costs.pass_seconds(evaluated, 1, 0),
                },
            }
        )

    # --- OpenAI-compatible ----------------------------------------------------------------------

    async def _openai_models(self, request: web.Request) -> web.Response:
        owner = "llamacpp" if self.config.kind == "llama_cpp" else "library"
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.model,
                        "object": "model",
                        "created": int(self._started),
                        "owned_by": owner,
                        "meta": {"n_ctx_train": self.config.context_per_slot},
                    }
                ],
            }
        )

    async def _openai_chat(self, request: web.Request) -> web.StreamResponse:
        chat = await self._accept(request, openai=True)
        if isinstance(chat, web.Response):
            return chat
        prompt_tokens = count_prompt_tokens(chat.messages, chat.tools)
        if prompt_tokens >= self.config.context_per_slot:
            return _error(
                400,
                f"the request exceeds the available context size ({prompt_tokens} tokens)",
                openai=True,
            )
        plan = self._plan(chat, prompt_tokens)
        answer = _OpenAIAnswer(
            chat, prompt_tokens, plan, self._submit(chat, prompt_tokens, plan)
        )
        if not chat.stream:
            text = "".join([piece async for piece in self._run(answer.seq, plan)])
            return web.json_response(answer.completion(text))
        return await self._openai_stream(request, answer)

    async def _openai_stream(
        self, request: web.Request, answer: _OpenAIAnswer
    ) -> web.StreamResponse:
        """Stream an answer as server-sent events, as llama-server does (timings, usage, [DONE])."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        try:
            await send(answer.chunk({"role": "assistant", "content": None}, None))
            async for piece in self._run(answer.seq, answer.plan):
                if piece:
                    await send(answer.chunk({"content": piece}, None))
            if tool_calls := answer.tool_calls():
                await send(answer.chunk({"tool_calls": tool_calls}, None))
            last = answer.chunk({}, answer.plan.finish_reason)
            if self.config.kind == "llama_cpp":
                last["timings"] = answer.timings()
            await send(last)
            if answer.chat.include_usage:
                final = answer.chunk({}, None)
                final["choices"] = []
                final["usage"] = answer.usage()
                await send(final)
            await send("[DONE]")
            await response.write_eof()
        except ConnectionResetError:
            # The client went away (cancelled, preempted): its slot is already freed.
            _LOGGER.debug("client disconnected mid-stream")
        return response

    # --- Ollama ---------------------------------------------------------------------------------

    async def _ollama_root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def _ollama_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": OLLAMA_VERSION})

    def _ollama_model(self) -> dict[str, Any]:
        return {
            "name": self.config.model,
            "model": self.config.model,
            "modified_at": "2026-01-01T00:00:00Z",
            "size": 4_920_000_000,
            # The digest names the model file: another quantization is another digest.
            "digest": hashlib.sha256(
                f"{self.config.model}-{self.config.quantization}".encode()
            ).hexdigest(),
            "details": {
                "format": "gguf",
                "family": "llama",
                "families": ["llama"],
                "parameter_size": "8.0B",
                "quantization_level": self.config.quantization,
            },
        }

    async def _ollama_tags(self, request: web.Request) -> web.Response:
        return web.json_response({"models": [self._ollama_model()]})

    async def _ollama_ps(self, request: web.Request) -> web.Response:
        loaded = self._ollama_model() | {
            "expires_at": "2099-01-01T00:00:00Z",
            "size_vram": 5_600_000_000,
            "context_length": self.config.context_per_slot,
        }
        return web.json_response({"models": [loaded]})

    async def _ollama_show(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        name = body.get("model") or body.get("name")
        if name != self.config.model:
            return _error(404, f"model '{name}' not found", openai=False)
        return web.json_response(
            {
                "modelfile": f"FROM {self.config.model}",
                "parameters": f"num_ctx {self.config.context_per_slot}",
                "template": "{{ .Prompt }}",
                "details": self._ollama_model()["details"],
                "model_info": {
                    "general.architecture": "llama",
                    "llama.context_length": 131072,
                },
                "capabilities": ["completion", "tools"],
            }
        )

    async def _ollama_chat(self, request: web.Request) -> web.StreamResponse:
        chat = await self._accept(request, openai=False)
        if isinstance(chat, web.Response):
            return chat
        if not chat.messages:
            # Ollama loads the model and answers at once ("load" request used to warm up).
            return web.json_response(
                {
                    "model": chat.model,
                    "created_at": _now_iso(),
                    "message": {"role": "assistant", "content": ""},
                    "done_reason": "load",
                    "done": True,
                }
            )
        prompt_tokens = count_prompt_tokens(chat.messages, chat.tools)
        plan = self._plan(chat, prompt_tokens)
        seq = self._submit(chat, prompt_tokens, plan)
        started = time.monotonic_ns()

        def final(text: str) -> dict[str, Any]:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if plan.tool_calls:
                message["tool_calls"] = [
                    {"function": {"name": call.name, "arguments": call.arguments}}
                    for call in plan.tool_calls
                ]
            elapsed = time.monotonic_ns() - started
            return {
                "model": chat.model,
                "created_at": _now_iso(),
                "message": message,
                "done": True,
                "done_reason": plan.finish_reason
                if plan.finish_reason != "tool_calls"
                else "stop",
                "total_duration": elapsed,
                "load_duration": 0,
                # Ollama counts only the prompt tokens it evaluated (not those it had cached).
                "prompt_eval_count": prompt_tokens - seq.cached_prompt_tokens,
                "prompt_eval_duration": elapsed // 10,
                "eval_count": len(plan.pieces),
                "eval_duration": elapsed - elapsed // 10,
            }

        if not chat.stream:
            text = "".join([piece async for piece in self._run(seq, plan)])
            return web.json_response(final(text))

        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            async for piece in self._run(seq, plan):
                if piece:
                    line = {
                        "model": chat.model,
                        "created_at": _now_iso(),
                        "message": {"role": "assistant", "content": piece},
                        "done": False,
                    }
                    await response.write(json.dumps(line).encode() + b"\n")
            await response.write(json.dumps(final("")).encode() + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            # The client went away (cancelled, preempted): its slot is already freed.
            _LOGGER.debug("client disconnected mid-stream")
        return response

    # --- shared ---------------------------------------------------------------------------------

    async def _accept(
        self, request: web.Request, *, openai: bool
    ) -> _ParsedChat | web.Response:
        """Read a chat request in its wire format; return it, or the error the server answers."""
        body = await _json_body(request)
        self.requests_seen.append(body)
        try:
            chat = _parse_openai(body) if openai else _parse_ollama(body)
        except (KeyError, TypeError, ValueError) as err:
            return _error(400, f"invalid request: {err}", openai=openai)
        refusal = self._refuse(chat, openai=openai)
        return chat if refusal is None else refusal

    def _refuse(self, chat: _ParsedChat, *, openai: bool) -> web.Response | None:
        if self.config.kind == "ollama" and chat.model != self.config.model:
            return _error(404, f"model '{chat.model}' not found", openai=openai)
        limit = self.config.max_queue
        if limit is not None and len(self.engine.waiting) >= limit:
            return _error(
                503,
                "server busy, please try again.  maximum pending requests exceeded",
                openai=openai,
            )
        return None

    def _plan(self, chat: _ParsedChat, prompt_tokens: int) -> AnswerPlan:
        return plan_answer(
            seed=self.config.seed,
            messages=chat.messages,
            tools=chat.tools,
            max_tokens=chat.max_tokens,
            ignore_eos=chat.ignore_eos,
            json_schema=chat.json_schema,
            context_left=max(1, self.config.context_per_slot - prompt_tokens),
        )

    def _submit(
        self, chat: _ParsedChat, prompt_tokens: int, plan: AnswerPlan
    ) -> Sequence:
        """Queue the answer in the engine (on the named slot, where the client named one)."""
        return self.engine.submit(
            prompt_tokens,
            len(plan.pieces),
            prompt_text=render_prompt(chat.messages, chat.tools),
            pieces=tuple(plan.pieces),
            slot=chat.slot if self.config.kind == "llama_cpp" else None,
        )

    async def _run(self, seq: Sequence, plan: AnswerPlan) -> AsyncIterator[str]:
        """Yield each token's text of a submitted answer as the engine produces it."""
        try:
            while (index := await seq.tokens.get()) is not None:
                yield plan.pieces[index]
        finally:
            self.engine.cancel(seq)


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}"


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"


def _error(status: int, message: str, *, openai: bool) -> web.Response:
    if openai:
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return web.json_response(
            {"error": {"code": status, "message": message, "type": kind}}, status=status
        )
    return web.json_response({"error": message}, status=status)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") for part in content if isinstance(part, dict)
        )
    raise TypeError("message content must be a string or a list of parts")


def _messages(raw: Any) -> list[SimMessage]:
    if not isinstance(raw, list):
        raise TypeError("messages must be a list")
    return [
        SimMessage(
            role=str(item["role"]),
            content=_content_text(item.get("content")),
            tool_calls=tuple(item.get("tool_calls") or ()),
        )
        for item in raw
    ]


def _tools(raw: Any) -> list[SimTool]:
    tools: list[SimTool] = []
    for item in raw or []:
        function = item.get("function", item)
        tools.append(
            SimTool(
                name=str(function["name"]), parameters=function.get("parameters") or {}
            )
        )
    return tools


def _parse_openai(body: dict[str, Any]) -> _ParsedChat:
    max_tokens = body.get(
        "max_completion_tokens", body.get("max_tokens", body.get("n_predict"))
    )
    schema: dict[str, Any] | None = body.get("json_schema")
    response_format = body.get("response_format")
    if (
        isinstance(response_format, dict)
        and response_format.get("type") == "json_schema"
    ):
        schema = response_format.get("json_schema", {}).get("schema", {})
    return _ParsedChat(
        messages=_messages(body["messages"]),
        tools=_tools(body.get("tools")),
        max_tokens=None
        if max_tokens is None or int(max_tokens) < 0
        else int(max_tokens),
        ignore_eos=bool(body.get("ignore_eos", False)),
        json_schema=schema,
        stream=bool(body.get("stream", False)),
        include_usage=bool(
            (body.get("stream_options") or {}).get("include_usage", False)
        ),
        model=str(body.get("model") or ""),
        slot=_slot(body.get("id_slot")),
    )


def _slot(value: Any) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None


def _parse_ollama(body: dict[str, Any]) -> _ParsedChat:
    options = body.get("options") or {}
    max_tokens = options.get("num_predict")
    schema = body.get("format")
    return _ParsedChat(
        messages=_messages(body.get("messages", [])),
        tools=_tools(body.get("tools")),
        max_tokens=None
        if max_tokens is None or int(max_tokens) < 0
        else int(max_tokens),
        ignore_eos=bool(options.get("ignore_eos", body.get("ignore_eos", False))),
        json_schema=schema if isinstance(schema, dict) else None,
        stream=bool(body.get("stream", True)),
        include_usage=True,
        model=str(body.get("model") or ""),
    )
