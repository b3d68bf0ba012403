"""Where an OpenAI-compatible server reports itself beyond ``/v1/models``, one source each.

A kind's description (``kinds.ServerProfile``) names its sources; ``OpenAIBackend`` reads them in
that order and merges what they say:

- ``InfoSource``: what the device shows (version, context per slot, slots, loaded models), read
  by ``server_info`` with the entries of ``/v1/models`` at hand;
- ``PrometheusMetrics``: the ``/metrics`` page and how its samples map to ``ServerMetrics``;
- ``LoadSource``: the rest of the live load (slots busy, loaded models), read by ``metrics``.

Ollama's native API reports itself in its own way (``/api/version``, ``/api/ps``), read by
``OllamaBackend``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from custom_components.llm_lanes.core.backends.prometheus import parse_samples
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics
from custom_components.llm_lanes.core.backends.transport import HttpClient
from custom_components.llm_lanes.core.errors import BackendError, BackendHTTPError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
NOT_ENABLED = 501
"""What llama.cpp answers at an endpoint it was started without (``--metrics``, ``--slots``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerFacts:
    """What one source says about the server; None where it says nothing."""

    version: str | None = None
    context_length: int | None = None
    slots: int | None = None
    loaded_models: tuple[str, ...] | None = None
    """None: the source does not say (every model served then counts as loaded)."""
    model_variants: Mapping[str, str] | None = None
    """What exactly each model runs as (``ServerInfo.model_variants``)."""


type InfoSource = Callable[
    [HttpClient, Sequence[Mapping[str, Any]]], Awaitable[ServerFacts]
]
"""Reads facts, given the server's client and the entries of its ``/v1/models``."""
type LoadSource = Callable[[HttpClient], Awaitable[ServerMetrics]]
"""Reads part of the live load."""


def merged_facts(facts: Iterable[ServerFacts]) -> ServerFacts:
    """Combine what several sources said: a later source's word wins where it says something."""
    return _merged(ServerFacts(), facts, says=lambda value: value is not None)


def merged_load(parts: Iterable[ServerMetrics]) -> ServerMetrics:
    """Combine parts of the live load: a later part's figures win where it has some.

    No loaded models (``()``) is no figure here: a part that does not read them says that.
    """
    return _merged(ServerMetrics(), parts, says=lambda value: value not in (None, ()))


def _merged[T: DataclassInstance](
    result: T, parts: Iterable[T], *, says: Callable[[Any], bool]
) -> T:
    """Overlay the parts on ``result`` in order, field by field, where ``says`` of the value."""
    for part in parts:
        result = replace(
            result,
            **{
                field.name: value
                for field in fields(part)
                if says(value := getattr(part, field.name))
            },
        )
    return result


def models_data(document: Any) -> list[dict[str, Any]]:
    """Return the model entries of a ``/v1/models``-shaped document (``data``)."""
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        return [model for model in document["data"] if isinstance(model, dict)]
    return []


def int_or_none(value: Any) -> int | None:
    """Return ``value`` as an int, None when it is missing or not a number."""
    try:
        return int(value) if value is not None else None
    except TypeError, ValueError:
        return None


async def served_models(http: HttpClient) -> tuple[str, ...]:
    """Models from ``/v1/models``."""
    return tuple(
        str(model.get("id")) for model in models_data(await http.get_json(MODELS_PATH))
    )


# --- what the device shows ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionAt:
    """The version under ``key`` of the JSON at ``path`` (none when the endpoint fails)."""

    path: str = "/version"
    key: str = "version"

    async def __call__(
        self, http: HttpClient, models: Sequence[Mapping[str, Any]]
    ) -> ServerFacts:
        """Read the version."""
        try:
            data = await http.get_json(self.path)
        except BackendError:
            return ServerFacts()
        if isinstance(data, dict) and self.key in data:
            return ServerFacts(version=str(data[self.key]))
        return ServerFacts()


async def llama_cpp_props(
    http: HttpClient, models: Sequence[Mapping[str, Any]]
) -> ServerFacts:
    """llama.cpp's ``/props``: its build, the context per slot, the slot count, the model file.

    llama-server serves one model (under its ``--alias``): the file is that of every entry.
    """
    props = await http.get_json("/props")
    settings = props.get("default_generation_settings") or {}
    path = props.get("model_path")
    return ServerFacts(
        version=props.get("build_info") or None,
        context_length=int_or_none(settings.get("n_ctx") or props.get("n_ctx")),
        slots=int_or_none(props.get("total_slots")),
        model_variants=(
            {str(model.get("id")): PurePosixPath(str(path)).name for model in models}
            if path
            else None
        ),
    )


async def max_model_len(
    http: HttpClient, models: Sequence[Mapping[str, Any]]
) -> ServerFacts:
    """Read the context from the longest ``max_model_len`` of ``/v1/models`` (vLLM)."""
    lengths = [model["max_model_len"] for model in models if model.get("max_model_len")]
    return ServerFacts(context_length=int_or_none(max(lengths)) if lengths else None)


async def model_roots(
    http: HttpClient, models: Sequence[Mapping[str, Any]]
) -> ServerFacts:
    """Read what each model of ``/v1/models`` was loaded from (vLLM's ``root``)."""
    roots = {
        str(model.get("id")): str(model["root"])
        for model in models
        if model.get("root")
    }
    return ServerFacts(model_variants=roots or None)


LM_STUDIO_MODELS_PATH = "/api/v0/models"


async def _lm_studio_loaded(http: HttpClient) -> list[dict[str, Any]]:
    return [
        model
        for model in models_data(await http.get_json(LM_STUDIO_MODELS_PATH))
        if model.get("state") == "loaded"
    ]


async def lm_studio_models(
    http: HttpClient, models: Sequence[Mapping[str, Any]]
) -> ServerFacts:
    """LM Studio's ``/api/v0/models``: the loaded models and the context they were loaded with."""
    loaded = await _lm_studio_loaded(http)
    lengths = [
        model.get("loaded_context_length") or model.get("max_context_length")
        for model in loaded
    ]
    known = [length for length in lengths if length]
    return ServerFacts(
        loaded_models=tuple(str(model.get("id")) for model in loaded),
        # One loaded model of unknown context makes the context unknown.
        context_length=(
            int_or_none(max(known)) if known and len(known) == len(lengths) else None
        ),
        model_variants={
            str(model.get("id")): str(model["quantization"])
            for model in loaded
            if model.get("quantization")
        },
    )


# --- the live load --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PrometheusMetrics:
    """A ``/metrics`` page in the Prometheus text format, and how to read it."""

    read: Callable[[Mapping[str, float]], ServerMetrics]
    """Maps the page's samples (``prometheus.parse_samples``) to the load."""
    optional: bool
    """Whether the server may run without the page (it answers 501: the load is read without)."""

    async def enabled(self, http: HttpClient) -> bool:
        """Tell whether the server serves the page (llama.cpp answers 501 without --metrics)."""
        try:
            await http.request_text("GET", METRICS_PATH)
        except BackendHTTPError:
            return False
        return True

    async def load(self, http: HttpClient) -> ServerMetrics:
        """Read the page."""
        try:
            text = await http.request_text("GET", METRICS_PATH)
        except BackendHTTPError as err:
            if not self.optional or err.status != NOT_ENABLED:
                raise
            return ServerMetrics()
        return self.read(parse_samples(text))


def slot_is_busy(slot: Mapping[str, Any]) -> bool:
    """Whether a llama.cpp ``/slots`` entry is processing (``state`` in older builds)."""
    if "is_processing" in slot:
        return bool(slot["is_processing"])
    return bool(slot.get("state", 0))


async def llama_cpp_slots(http: HttpClient) -> ServerMetrics:
    """llama.cpp's ``/slots``: how many there are and how many are processing."""
    try:
        slots = await http.get_json("/slots")
    except BackendHTTPError as err:
        if err.status != NOT_ENABLED:  # started without --slots
            raise
        return ServerMetrics()
    if not isinstance(slots, list):
        return ServerMetrics()
    return ServerMetrics(
        slots_total=len(slots),
        slots_busy=sum(1 for slot in slots if slot_is_busy(slot)),
    )


async def llama_cpp_busy_slots(http: HttpClient) -> frozenset[int] | None:
    """llama.cpp's ``/slots``: the ids of those processing (None: started without ``--slots``)."""
    try:
        slots = await http.get_json("/slots")
    except BackendHTTPError as err:
        if err.status != NOT_ENABLED:
            raise
        return None
    if not isinstance(slots, list):
        return None
    return frozenset(
        int(slot.get("id", index))
        for index, slot in enumerate(slots)
        if isinstance(slot, dict) and slot_is_busy(slot)
    )


async def served_models_loaded(http: HttpClient) -> ServerMetrics:
    """Every model of ``/v1/models`` counts as loaded (servers that do not unload models)."""
    return ServerMetrics(loaded_models=await served_models(http))


async def lm_studio_loaded(http: HttpClient) -> ServerMetrics:
    """Read which models LM Studio has loaded now (``/api/v0/models``)."""
    return ServerMetrics(
        loaded_models=tuple(
            str(model.get("id")) for model in await _lm_studio_loaded(http)
        )
    )
