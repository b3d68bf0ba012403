"""What llama.cpp (``--metrics``) and vLLM report at ``/metrics``, as ``ServerMetrics``.

The page is in the Prometheus text format, read by ``prometheus_text``.
"""

from __future__ import annotations

from collections.abc import Mapping
import math

from custom_components.llm_lanes.core.backends.prometheus_text import parse
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics


def parse_samples(text: str) -> dict[str, float]:
    """Sum every sample by its name across label sets (one model per server: sums are totals).

    Counter samples keep their ``_total`` suffix, as the server writes them. A page that is not
    in the Prometheus text format raises ``MalformedStreamError``.
    """
    totals: dict[str, float] = {}
    for sample in parse(text).samples:
        totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def first_of(samples: Mapping[str, float], *names: str) -> float | None:
    """Return the value of the first name present (servers renamed metrics between versions).

    A value the server could not compute (NaN, an infinity) says nothing.
    """
    for name in names:
        if name in samples:
            value = samples[name]
            return value if math.isfinite(value) else None
    return None


def _as_int(value: float | None) -> int | None:
    return None if value is None else round(value)


def llama_cpp_metrics(samples: Mapping[str, float]) -> ServerMetrics:
    """Map llama.cpp's ``llamacpp:*`` metrics."""
    usage = first_of(samples, "llamacpp:kv_cache_usage_ratio")
    return ServerMetrics(
        requests_running=_as_int(first_of(samples, "llamacpp:requests_processing")),
        requests_waiting=_as_int(first_of(samples, "llamacpp:requests_deferred")),
        kv_cache_usage=usage,
        prompt_tokens_total=_as_int(first_of(samples, "llamacpp:prompt_tokens_total")),
        output_tokens_total=_as_int(
            first_of(samples, "llamacpp:tokens_predicted_total")
        ),
    )


def vllm_metrics(samples: Mapping[str, float]) -> ServerMetrics:
    """Map vLLM's ``vllm:*`` metrics (``gpu_cache_usage_perc`` is the pre-V1 name)."""
    return ServerMetrics(
        requests_running=_as_int(first_of(samples, "vllm:num_requests_running")),
        requests_waiting=_as_int(first_of(samples, "vllm:num_requests_waiting")),
        kv_cache_usage=first_of(
            samples, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"
        ),
        preemptions=_as_int(
            first_of(samples, "vllm:num_preemptions_total", "vllm:num_preemptions")
        ),
        prompt_tokens_total=_as_int(first_of(samples, "vllm:prompt_tokens_total")),
        output_tokens_total=_as_int(first_of(samples, "vllm:generation_tokens_total")),
    )
