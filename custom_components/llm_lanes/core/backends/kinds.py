"""One description per kind of LLM server: what it is, how it is told apart, what it can do.

Everything that differs between kinds is here, as data (or a small source of ``reports``
referenced by the description); the clients, detection, the coordinator, the gateway and the
benchmark read a ``ServerProfile`` and never ask which kind they talk to. ``ServerKind`` is the
enum of the ids that config entries store.

Adding a kind is a change here: its id in ``ServerKind`` and its ``ServerProfile`` in
``SERVER_PROFILES`` (in detection order: most specific first, the generic OpenAI-compatible
server last); then its tests, and the translations that name the supported servers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from custom_components.llm_lanes.core.backends.probes import (
    Evidence,
    HasKey,
    ListsEntries,
    Probe,
    TextHas,
)
from custom_components.llm_lanes.core.backends.prometheus import (
    llama_cpp_metrics,
    vllm_metrics,
)
from custom_components.llm_lanes.core.backends.prompt_counts import (
    PromptCounter,
    llama_cpp_prompt_tokens,
    vllm_prompt_tokens,
)
from custom_components.llm_lanes.core.backends.reports import (
    InfoSource,
    LoadSource,
    PrometheusMetrics,
    VersionAt,
    llama_cpp_props,
    llama_cpp_slots,
    lm_studio_loaded,
    lm_studio_models,
    max_model_len,
    model_roots,
    served_models_loaded,
)


class ServerKind(StrEnum):
    """The kind of LLM server behind a base URL: the id config entries store.

    What each kind is and can do is its description, ``kinds.ServerProfile``.
    """

    OLLAMA = "ollama"
    LLAMA_CPP = "llama_cpp"
    VLLM = "vllm"
    LM_STUDIO = "lm_studio"
    LOCALAI = "localai"
    OPENAI_COMPATIBLE = "openai_compatible"


class WireApi(StrEnum):
    """The API a server speaks, and so the client that talks to it."""

    OLLAMA = "ollama"
    """Ollama's native API (``OllamaBackend``): ``/api/chat`` as NDJSON, ``/api/ps`` for what
    is loaded, its own version, and its own description of a model (``/api/show``)."""
    OPENAI = "openai"
    """The OpenAI-compatible API (``OpenAIBackend``): ``/v1/chat/completions`` as server-sent
    events, ``/v1/models``; what else the server reports comes from the profile's sources."""


class ContextSetting(StrEnum):
    """Where a server's owner sets the context each request may hold (what a small one changes).

    The value names the small-context repair's advice (``small_context_<value>``).
    """

    CTX_SIZE = "ctx_size"
    """llama.cpp: ``--ctx-size`` is shared by the ``--parallel`` slots."""
    CONTEXT_LENGTH = "context_length"
    """Ollama: ``OLLAMA_CONTEXT_LENGTH`` (or a model's ``num_ctx``)."""
    MAX_MODEL_LEN = "max_model_len"
    """vLLM: ``--max-model-len``."""
    MODEL_LOAD = "model_load"
    """The context the model is loaded with, in the server's own settings (LM Studio, LocalAI,
    other OpenAI-compatible servers)."""


NO_FIELDS: Final[Mapping[str, Any]] = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ServerProfile:
    """What one kind of server is and can do. Every field is stated by every description."""

    kind: ServerKind
    """The id (stored in config entries)."""
    name: str
    """What users read: the device's manufacturer, the start of the entry's title."""
    api: WireApi
    detection: tuple[Evidence, ...]
    """What tells this kind from the others: any one piece of evidence (``probes``)."""

    # --- what requests may carry ------------------------------------------------------------
    takes_priority: bool
    """Requests carry the lane's ``priority`` (vLLM's priority scheduling; turned off at run
    time when the server refuses it)."""
    resume_fields: Mapping[str, Any]
    """What a request adds when it continues an interrupted answer (sent as a final assistant
    message): vLLM must be told to continue that message rather than close it. Empty where the
    server continues a final assistant message as it is."""
    chooses_slots: bool
    """Requests name the slot they run on (llama.cpp ``id_slot``): ``Backend.chooses_slots``."""
    prefills_in_steps: bool
    """A prompt can be rendered by the server's template and prefilled into a slot's cache in
    steps (llama.cpp ``/apply-template`` and ``/completion``): ``Backend.prefills_in_steps``."""
    takes_ignore_eos: bool
    """The server honours ``ignore_eos``, so the benchmark's answers are exactly as long as
    planned (elsewhere an answer may end early and measure less)."""
    counts_prompts: PromptCounter | None
    """How the server counts a request's prompt before it runs, with its own chat template and
    tokenizer (``prompt_counts``); None where it documents no way to (a quota then bounds the
    prompt instead: ``core.quota_prompts``)."""

    # --- models in memory -------------------------------------------------------------------
    unloads_models: bool
    """Loads models on demand, lets them go, and says which are resident: an empty list means
    none is, and a model found unloaded is warmed up again (others list every model served)."""
    warm_up_at_setup: bool
    """Warm the model up once at set-up even when it is loaded: the warm-up's ``keep_alive``
    keeps it resident (Ollama lets a model another client loaded go after 5 minutes)."""

    # --- where it reports itself (OpenAI API; Ollama's native API has its own) ----------------
    info_from: tuple[InfoSource, ...]
    """Sources of version, context per slot, slots and loaded models, beyond ``/v1/models``."""
    prometheus: PrometheusMetrics | None
    """The ``/metrics`` page, where the server has one."""
    load_from: tuple[LoadSource, ...]
    """Sources of the rest of the live load (slots busy, loaded models)."""
    context_setting: ContextSetting
    """Where its owner gives each request more context (the small-context repair says so)."""


SERVER_PROFILES: Final[tuple[ServerProfile, ...]] = (
    ServerProfile(
        kind=ServerKind.OLLAMA,
        name="Ollama",
        api=WireApi.OLLAMA,
        detection=(
            (
                Probe("/api/version", HasKey(("version",))),
                Probe("/api/tags", HasKey(("models",))),
            ),
        ),
        takes_priority=False,
        resume_fields=NO_FIELDS,
        chooses_slots=False,
        prefills_in_steps=False,
        takes_ignore_eos=True,
        counts_prompts=None,
        unloads_models=True,
        warm_up_at_setup=True,
        info_from=(),
        prometheus=None,
        load_from=(),
        context_setting=ContextSetting.CONTEXT_LENGTH,
    ),
    ServerProfile(
        kind=ServerKind.LLAMA_CPP,
        name="llama.cpp",
        api=WireApi.OPENAI,
        detection=(
            (Probe("/props", HasKey(("total_slots", "default_generation_settings"))),),
        ),
        takes_priority=False,
        resume_fields=NO_FIELDS,
        chooses_slots=True,
        prefills_in_steps=True,
        takes_ignore_eos=True,
        counts_prompts=llama_cpp_prompt_tokens,
        unloads_models=False,
        warm_up_at_setup=False,
        info_from=(llama_cpp_props,),
        prometheus=PrometheusMetrics(read=llama_cpp_metrics, optional=True),
        load_from=(llama_cpp_slots, served_models_loaded),
        context_setting=ContextSetting.CTX_SIZE,
    ),
    ServerProfile(
        kind=ServerKind.VLLM,
        name="vLLM",
        api=WireApi.OPENAI,
        detection=(
            (Probe("/v1/models", ListsEntries(key="owned_by", value="vllm")),),
            # A vLLM that does not say it owns its models is known by its metric names.
            (Probe("/v1/models", ListsEntries()), Probe("/metrics", TextHas("vllm:"))),
        ),
        takes_priority=True,
        resume_fields=MappingProxyType(
            {"continue_final_message": True, "add_generation_prompt": False}
        ),
        chooses_slots=False,
        prefills_in_steps=False,
        takes_ignore_eos=False,
        counts_prompts=vllm_prompt_tokens,
        unloads_models=False,
        warm_up_at_setup=False,
        info_from=(VersionAt(), max_model_len, model_roots),
        prometheus=PrometheusMetrics(read=vllm_metrics, optional=False),
        load_from=(),
        context_setting=ContextSetting.MAX_MODEL_LEN,
    ),
    ServerProfile(
        kind=ServerKind.LM_STUDIO,
        name="LM Studio",
        api=WireApi.OPENAI,
        detection=((Probe("/api/v0/models", ListsEntries(key="state")),),),
        takes_priority=False,
        resume_fields=NO_FIELDS,
        chooses_slots=False,
        prefills_in_steps=False,
        takes_ignore_eos=False,
        counts_prompts=None,
        unloads_models=True,
        warm_up_at_setup=False,
        info_from=(lm_studio_models,),
        prometheus=None,
        load_from=(lm_studio_loaded,),
        context_setting=ContextSetting.MODEL_LOAD,
    ),
    ServerProfile(
        kind=ServerKind.LOCALAI,
        name="LocalAI",
        api=WireApi.OPENAI,
        detection=((Probe("/system", HasKey(("backends",))),),),
        takes_priority=False,
        resume_fields=NO_FIELDS,
        chooses_slots=False,
        prefills_in_steps=False,
        takes_ignore_eos=False,
        counts_prompts=None,
        unloads_models=False,
        warm_up_at_setup=False,
        info_from=(VersionAt(),),
        prometheus=None,
        load_from=(served_models_loaded,),
        context_setting=ContextSetting.MODEL_LOAD,
    ),
    ServerProfile(
        kind=ServerKind.OPENAI_COMPATIBLE,
        name="OpenAI-compatible server",
        api=WireApi.OPENAI,
        detection=((Probe("/v1/models", ListsEntries()),),),
        takes_priority=False,
        resume_fields=NO_FIELDS,
        chooses_slots=False,
        prefills_in_steps=False,
        takes_ignore_eos=False,
        counts_prompts=None,
        unloads_models=False,
        warm_up_at_setup=False,
        info_from=(),
        prometheus=None,
        load_from=(served_models_loaded,),
        context_setting=ContextSetting.MODEL_LOAD,
    ),
)
"""Every kind, in detection order: the first whose evidence matches is the server's kind."""

_BY_KIND: Final[Mapping[ServerKind, ServerProfile]] = MappingProxyType(
    {profile.kind: profile for profile in SERVER_PROFILES}
)


def server_profile(kind: ServerKind | ServerProfile) -> ServerProfile:
    """Return the description of a kind (a description is its own)."""
    return kind if isinstance(kind, ServerProfile) else _BY_KIND[kind]
