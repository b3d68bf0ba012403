"""The samples of a /metrics page summed by name, and their mapping to ServerMetrics."""

from __future__ import annotations

import pytest

from custom_components.llm_lanes.core.backends.prometheus import (
    first_of,
    llama_cpp_metrics,
    parse_samples,
    vllm_metrics,
)
from custom_components.llm_lanes.core.errors import MalformedStreamError

from .conftest import fixture_text


def test_recorded_llama_cpp_metrics() -> None:
    """The real llama-server's /metrics, recorded with one stream running."""
    samples = parse_samples(fixture_text("llamacpp/metrics_busy.txt"))
    assert samples["llamacpp:requests_processing"] == 1
    metrics = llama_cpp_metrics(samples)
    assert metrics.requests_running == 1
    assert metrics.requests_waiting == 0
    assert metrics.output_tokens_total == 6
    assert metrics.kv_cache_usage is None  # this llama.cpp build no longer exports it


def test_samples_are_summed_across_labels() -> None:
    """One series per engine or model: the totals add up."""
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 2\n'
        'vllm:num_requests_running{engine="1"} 3\n'
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        "vllm:gpu_cache_usage_perc 0.5\n"
    )
    metrics = vllm_metrics(parse_samples(text))
    assert metrics.requests_running == 5
    assert metrics.kv_cache_usage == 0.5  # the pre-V1 name is still read
    assert metrics.requests_waiting is None


def test_first_of() -> None:
    """The first name present wins."""
    assert first_of({"b": 2.0, "c": 3.0}, "a", "b", "c") == 2.0
    assert first_of({}, "a") is None


def test_figures_the_server_could_not_compute_say_nothing() -> None:
    """NaN and infinities (a rate over no time) are no figure, and never break the mapping."""
    text = (
        "llamacpp:requests_processing NaN\n"
        "llamacpp:kv_cache_usage_ratio +Inf\n"
        "llamacpp:requests_deferred 2\n"
    )
    metrics = llama_cpp_metrics(parse_samples(text))
    assert metrics.requests_running is None
    assert metrics.kv_cache_usage is None
    assert metrics.requests_waiting == 2


def test_not_prometheus() -> None:
    """Text that is not the exposition format is a typed error (``prometheus_text`` says which)."""
    with pytest.raises(MalformedStreamError, match="Prometheus text format"):
        parse_samples("metric_without_value\n")
