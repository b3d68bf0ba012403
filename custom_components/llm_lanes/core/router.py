"""Which server of a pool a request goes to: the one where its caller will feel it least.

For each server that may serve the request's lane, is up and can serve the request at all
(``Capabilities``: model, context, tools, JSON schema), the router estimates what the caller will
feel there (``Estimate``):

- the **time to the first token**: the wait for a slot (the requests ahead of it in its lane and
  above, and those the server says wait inside it, ``Candidate.server_waiting``, against the
  slots open to it, at the time a request holds a slot there) plus the prefill
  of the part of its prompt the server does not hold already. A server holds a prompt's stable
  prefix (the Assist prompt: system prompt, exposed entities, tool schemas) or a conversation's
  earlier turns where a free slot's cache has them (``slots.SlotTable``, where the scheduler
  places requests on slots), else where the pool sent them lately (``RecentPrefixes``). The
  prefill takes ``overhead + tokens / speed``, fitted from the requests the server answered
  (``Observed``), with the speed the scheduler learned from its prefill steps where it has one;
- the **inter-token gap**: the server's learned batch cost with one more sequence in flight
  (``batch_cost.BatchCostModel``).

What is felt (``Estimate.felt_s``) is the first token's wait, counted from the lane's
time-to-first-token objective up (a wait within the objective is what the lane's callers need, and
counts as the objective), plus ``output tokens × excess`` where the gap exceeds the lane's
inter-token objective (every token comes that much later). Within the objectives, then, the
household's order of preference decides (the preferred box usually runs the better model); beyond
them, the faster server wins: a warm Assist prompt on the mini PC beats a GPU box that is busy or
has to prefill it all, and a CPU box whose tokens come slower than the objective loses to one
whose do not.

The request goes to its *incumbent* unless another server is clearly better, as Llumnix-style
placement does (Sun et al., OSDI 2024: place by each instance's live load, and move only for a
clear gain): by ``margin`` of the incumbent's estimate and at least ``margin_s``. The incumbent of
a conversation that has earlier turns is the server it went to last (its history is warm there);
of any other request, the lane's most preferred server that is up. Estimates follow the servers'
live load and what they learn, so placement adapts as conditions change, and returns to the
preferred server once it can meet the objectives again.

A decision reads a few numbers of each server (``server_load.ServerLoad``) and hashes the prompt's
prefixes once: well under 0.2 ms for a household's servers (``scripts/bench micro``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
import statistics

from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.model import ChatRequest, TokenUsage
from custom_components.llm_lanes.core.prompt_prefixes import PrefixKeys
from custom_components.llm_lanes.core.server_load import ServerLoad
from custom_components.llm_lanes.core.slots import prefix_keys
from custom_components.llm_lanes.core.snapshot import FinishedRequest
from custom_components.llm_lanes.core.tokens import estimate_prompt_tokens

ANY_MODEL = ""
"""The model of a request that names none: each server runs it as its own (``Capabilities.model``)."""
DEFAULT_MARGIN = 0.25
"""Another server is clearly faster when its estimate is this fraction below the incumbent's..."""
DEFAULT_MARGIN_S = 0.05
"""... and at least this many seconds below it."""
DEFAULT_PREFILL_TOK_S = 1000.0
"""Prefill speed assumed of a server until it is learned (a modest GPU's, a fast CPU's)."""
DEFAULT_HOLD_S = 2.0
"""How long a request holds a slot, assumed of a server until it is learned."""
HOLD_WEIGHT = 0.2
"""Weight of each new request in the learned slot-holding time (exponential average)."""
PREFILL_SAMPLES = 64
"""Recent requests the prefill fit follows."""
HOMES_KEPT = 4096
"""Conversations (and stable prefixes) whose server the router remembers."""
STABLE_SIZES_KEPT = 256
"""Stable prefixes whose token count is kept (they recur: the same Assist prompt)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What one server of a pool can serve."""

    model: str | None = None
    """The model it runs a request naming ``ANY_MODEL`` as (None: it takes no such request)."""
    models: tuple[str, ...] = ()
    """The models it serves (empty: any model a request names)."""
    context_tokens: int | None = None
    """The context of one slot: prompt and output must fit (None: unknown, not checked)."""
    tools: bool = True
    """Whether it takes tools (llama.cpp without ``--jinja`` does not)."""
    json_schema: bool = True
    """Whether it constrains output to a JSON schema."""

    def model_for(self, request: ChatRequest) -> str | None:
        """Return the model the request runs as here (None: this server does not serve it)."""
        if request.model == ANY_MODEL:
            return self.model
        if not self.models or request.model in self.models:
            return request.model
        return None

    def refusal(
        self, request: ChatRequest, prompt_tokens: int, output_tokens: int
    ) -> str | None:
        """Return why this server cannot serve the request (None: it can)."""
        if self.model_for(request) is None:
            return f"it does not serve the model {request.model or '(any)'}"
        if request.tools and not self.tools:
            return "it does not take tools"
        if request.json_schema is not None and not self.json_schema:
            return "it does not follow JSON schemas"
        if (
            self.context_tokens is not None
            and prompt_tokens + output_tokens > self.context_tokens
        ):
            return (
                f"{prompt_tokens} prompt and {output_tokens} output tokens exceed its "
                f"context of {self.context_tokens}"
            )
        return None


@dataclass(frozen=True, slots=True)
class PromptShape:
    """What routing needs of a request's prompt, worked out once for every server."""

    tokens: int
    """The whole prompt."""
    stable_tokens: int
    """Its system messages and tool schemas (the part every Assist command shares)."""
    history_tokens: int
    """Everything before its last user message (what a slot holding the conversation has)."""
    keys: PrefixKeys
    home: str | None
    """What the server of its conversation is remembered by, once it has earlier turns (None:
    a request on its own, whose incumbent is the lane's preferred server)."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """What the caller would feel of a request at one server."""

    server: str
    wait_s: float
    """For a slot."""
    prefill_s: float
    """Of the prompt tokens the server does not hold."""
    cached_tokens: int
    """Prompt tokens the server is expected to hold already."""
    itl_s: float | None
    """The learned inter-token gap with this request in the batch (None: nothing learned)."""
    felt_s: float
    """What the router minimises: the first token's wait (from the lane's objective up) and the
    answer's lateness beyond the lane's inter-token objective."""

    @property
    def ttft_s(self) -> float:
        """The expected time to the first token."""
        return self.wait_s + self.prefill_s


class RecentPrefixes:
    """The prompt prefixes a pool sent to one server lately (where its slots are not known)."""

    __slots__ = ("_capacity", "_keys")

    def __init__(self, capacity: int) -> None:
        """Keep the latest ``capacity`` prefixes (a server's prompt caches hold as many)."""
        self._capacity = max(capacity, 1)
        self._keys: OrderedDict[str, None] = OrderedDict()

    def note(self, keys: PrefixKeys) -> None:
        """Remember the prefixes of a request sent to the server."""
        for key in (keys.stable, keys.conversation):
            if key is None:
                continue
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self._capacity:
            self._keys.popitem(last=False)

    def holds(self, keys: PrefixKeys) -> tuple[bool, bool]:
        """Whether the conversation, and the stable prefix, were sent there lately."""
        return (
            keys.conversation is not None and keys.conversation in self._keys,
            keys.stable is not None and keys.stable in self._keys,
        )


class Observed:
    """What a pool learned of one server from the requests it answered.

    The slot-holding time is an exponential average of the requests' time from admission to
    their end. The prefill time of a prompt is ``overhead + tokens / speed``: with the speed the
    scheduler learned from its prefill steps where it has one (the overhead is then the median of
    what that speed leaves unexplained); else a least-squares line through the recent requests'
    (evaluated tokens, admission to first token), or a speed through the origin while their sizes
    hardly differ; else the prior speed.
    """

    __slots__ = ("_fit", "_overhead", "_prior_tok_s", "_samples", "hold_s")

    def __init__(self, prior_tok_s: float = DEFAULT_PREFILL_TOK_S) -> None:
        """Start from the priors."""
        self._prior_tok_s = prior_tok_s
        self._samples: deque[tuple[int, float]] = deque(maxlen=PREFILL_SAMPLES)
        self._fit: tuple[float, float] | None = None
        """(overhead in seconds, seconds per token) fitted to the requests (None: none yet)."""
        self._overhead: tuple[float, float] | None = None
        """(speed, overhead) last worked out for the scheduler's learned speed."""
        self.hold_s = DEFAULT_HOLD_S

    def learn(self, record: FinishedRequest, usage: TokenUsage | None) -> None:
        """Learn from a request that ended well on the server (``usage``: its final chunk's)."""
        if record.outcome != "ok":
            return
        hold = record.e2e_s - record.queue_wait_s
        self.hold_s += HOLD_WEIGHT * (hold - self.hold_s)
        if record.ttft_s is None or record.preemptions:
            return
        tokens = (
            usage.prompt_tokens_evaluated
            if usage is not None and usage.source == "server"
            else record.prompt_tokens
        )
        seconds = record.ttft_s - record.queue_wait_s
        if tokens > 0 and seconds > 0:
            self._samples.append((tokens, seconds))
            self._fit = _fit(self._samples)
            self._overhead = None

    def prefill_s(self, tokens: int, learned_tok_s: float | None) -> float:
        """Return the expected prefill time of ``tokens`` prompt tokens."""
        if learned_tok_s is not None and learned_tok_s > 0:
            per_token = 1.0 / learned_tok_s
            known = self._overhead
            if known is None or known[0] != learned_tok_s:
                overhead = 0.0
                if self._samples:
                    overhead = max(
                        0.0,
                        statistics.median(s - t * per_token for t, s in self._samples),
                    )
                self._overhead = known = (learned_tok_s, overhead)
            return known[1] + tokens * per_token
        if self._fit is None:
            return tokens / self._prior_tok_s
        overhead, per_token = self._fit
        return overhead + tokens * per_token


def _fit(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line of seconds against tokens; without spread, a speed through the origin."""
    xs = [float(t) for t, _ in samples]
    ys = [s for _, s in samples]
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if len(samples) >= 4 and var >= (0.1 * mean_x) ** 2 * len(xs):
        slope = (
            sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
        )
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept >= 0:
            return intercept, slope
    return 0.0, statistics.median(s / t for t, s in samples)


@dataclass(eq=False, slots=True, kw_only=True)
class Candidate:
    """A server as the router weighs it."""

    name: str
    load: ServerLoad
    capabilities: Capabilities = field(default_factory=Capabilities)
    observed: Observed = field(default_factory=Observed)
    recent: RecentPrefixes = field(default_factory=lambda: RecentPrefixes(8))
    server_waiting: int = 0
    """Requests waiting inside the server that its scheduler did not send (its own metrics:
    an engine shared with other clients, or a distributed one): ahead of every new request."""


class Router:
    """Places requests on the servers of a pool (see the module docstring)."""

    __slots__ = ("_homes", "_stable_sizes", "margin", "margin_s")

    def __init__(
        self, *, margin: float = DEFAULT_MARGIN, margin_s: float = DEFAULT_MARGIN_S
    ) -> None:
        """Move a request from its incumbent only for a gain of ``margin`` and ``margin_s``."""
        self.margin = margin
        self.margin_s = margin_s
        self._homes: OrderedDict[str, str] = OrderedDict()
        self._stable_sizes: dict[str, int] = {}

    def shape(
        self, request: ChatRequest, prompt_tokens: int | None = None
    ) -> PromptShape:
        """Work out what routing needs of a request's prompt (``prompt_tokens``: when known).

        Sizes are ``tokens.estimate_prompt_tokens``'s; the stable prefix's is kept per prefix
        (its tool schemas are most of the cost, and it recurs).
        """
        keys = prefix_keys(request)
        messages = request.messages
        stable = 0
        if keys.stable is not None:
            known = self._stable_sizes.get(keys.stable)
            if known is None:
                if len(self._stable_sizes) >= STABLE_SIZES_KEPT:
                    self._stable_sizes.clear()
                known = self._stable_sizes[keys.stable] = estimate_prompt_tokens(
                    ChatRequest(
                        model=request.model,
                        messages=tuple(m for m in messages if m.role == "system"),
                        tools=request.tools,
                    )
                )
            stable = known
        turns = tuple(m for m in messages if m.role != "system")
        total = prompt_tokens
        if total is None:
            rest = (
                estimate_prompt_tokens(
                    ChatRequest(
                        model=request.model,
                        messages=turns,
                        assistant_prefix=request.assistant_prefix,
                    )
                )
                if turns or request.assistant_prefix
                else 0
            )
            total = max(stable + rest, 1)
        last_user = next(
            (i for i in range(len(turns) - 1, -1, -1) if turns[i].role == "user"),
            None,
        )
        history = stable
        earlier_turns = False
        if last_user is not None:
            tail = estimate_prompt_tokens(
                ChatRequest(
                    model=request.model,
                    messages=turns[last_user:],
                    assistant_prefix=request.assistant_prefix,
                )
            )
            history = max(stable, total - tail)
            earlier_turns = any(m.role == "assistant" for m in turns[:last_user])
        return PromptShape(
            tokens=total,
            stable_tokens=min(stable, total),
            history_tokens=min(history, total),
            keys=keys,
            home=keys.conversation if earlier_turns else None,
        )

    def estimate(
        self,
        candidate: Candidate,
        shape: PromptShape,
        lane: Lane,
        output_tokens: int,
        now: float,
    ) -> Estimate:
        """Estimate what a request of ``lane`` would feel at one server now."""
        load = candidate.load
        settings = load.settings
        holds = load.holds(shape.keys)
        if holds is None:
            holds = candidate.recent.holds(shape.keys)
        conversation, stable = holds
        cached = (
            shape.history_tokens
            if conversation
            else shape.stable_tokens
            if stable
            else 0
        )
        prefill = candidate.observed.prefill_s(
            max(shape.tokens - cached, 1), load.prefill_tok_s()
        )
        ahead = load.waiting_ahead(lane) + candidate.server_waiting
        open_slots = load.open_slots(lane, now)
        wait = 0.0
        if ahead >= open_slots:
            wait = (
                (ahead - open_slots + 1)
                * candidate.observed.hold_s
                / max(settings.max_sequences, 1)
            )
        itl = load.itl_s(load.in_flight + 1, now)
        limits = settings.lanes[lane]
        felt = max(wait + prefill, limits.ttft_slo_s)
        if itl is not None:
            felt += output_tokens * max(0.0, itl - limits.itl_slo_s)
        return Estimate(
            server=candidate.name,
            wait_s=wait,
            prefill_s=prefill,
            cached_tokens=cached,
            itl_s=itl,
            felt_s=felt,
        )

    def choose(
        self,
        candidates: Sequence[Candidate],
        shape: PromptShape,
        lane: Lane,
        output_tokens: int,
        now: float,
    ) -> Estimate:
        """Return the estimate of the server chosen among ``candidates`` (in preference order).

        The choice is remembered as the incumbent of the request's conversation.
        """
        if not candidates:
            raise ValueError("no candidate to choose from")
        estimates = [
            self.estimate(candidate, shape, lane, output_tokens, now)
            for candidate in candidates
        ]
        home = self._homes.get(shape.home) if shape.home is not None else None
        incumbent = next((e for e in estimates if e.server == home), estimates[0])
        best = min(estimates, key=lambda e: e.felt_s)  # the first of equals: preference
        gain = incumbent.felt_s - best.felt_s
        chosen = (
            best
            if gain > max(self.margin_s, self.margin * incumbent.felt_s)
            else incumbent
        )
        if shape.home is not None:
            self._homes[shape.home] = chosen.server
            self._homes.move_to_end(shape.home)
            if len(self._homes) > HOMES_KEPT:
                self._homes.popitem(last=False)
        return chosen

    def incumbent(self, shape: PromptShape) -> str | None:
        """Return the server the request's conversation went to last (None: none remembered)."""
        return self._homes.get(shape.home) if shape.home is not None else None


def with_model(request: ChatRequest, model: str) -> ChatRequest:
    """Return the request naming ``model`` (unchanged when it does)."""
    return request if request.model == model else replace(request, model=model)
