"""The Prometheus text exposition format: real pages, escapes, comments, and what it refuses."""

from __future__ import annotations

import math

from hypothesis import given, strategies as st
import pytest

from custom_components.llm_lanes.core.backends.prometheus_text import (
    METRIC_TYPES,
    Sample,
    parse,
)
from custom_components.llm_lanes.core.errors import MalformedStreamError

from .conftest import fixture_text


def test_recorded_llama_cpp_page() -> None:
    """The real llama-server's /metrics: every family typed, one unlabelled sample each."""
    page = parse(fixture_text("llamacpp/metrics_busy.txt"))
    assert len(page.samples) == 15
    assert set(page.types) == {sample.name for sample in page.samples}
    assert page.types["llamacpp:prompt_tokens_total"] == "counter"
    assert page.types["llamacpp:requests_processing"] == "gauge"
    assert all(sample.labels == {} for sample in page.samples)
    values = {sample.name: sample.value for sample in page.samples}
    assert values["llamacpp:prompt_tokens_total"] == 35
    assert values["llamacpp:prompt_seconds_total"] == pytest.approx(0.026913)
    assert values["llamacpp:predicted_tokens_seconds"] == pytest.approx(406.273)


def test_documented_vllm_page() -> None:
    """The /metrics output vLLM documents: a histogram whose series carry labels."""
    page = parse(fixture_text("vllm/metrics_documented.txt"))
    assert page.types == {"vllm:iteration_tokens_total": "histogram"}
    first, *buckets = page.samples
    model = "unsloth/Llama-3.2-1B-Instruct"
    assert first == Sample(
        "vllm:iteration_tokens_total_sum", {"model_name": model}, 0.0
    )
    assert [bucket.labels["le"] for bucket in buckets] == [
        "1.0",
        "8.0",
        "16.0",
        "32.0",
        "64.0",
        "128.0",
        "256.0",
        "512.0",
    ]
    assert {bucket.name for bucket in buckets} == {"vllm:iteration_tokens_total_bucket"}
    assert all(bucket.labels["model_name"] == model for bucket in buckets)
    assert all(bucket.value == 3.0 for bucket in buckets)


def test_escaped_label_values() -> None:
    r"""``\\``, ``\"`` and ``\n`` are unescaped; braces, commas and ``#`` in a value are text."""
    (sample,) = parse(
        'm{path="C:\\\\models",say="\\"hi\\"",two="a\\nb",odd="} , # {x=\\"y\\"}"} 1\n'
    ).samples
    assert sample.labels == {
        "path": "C:\\models",
        "say": '"hi"',
        "two": "a\nb",
        "odd": '} , # {x="y"}',
    }


def test_what_the_format_allows() -> None:
    """Blanks, comments, empty braces, a trailing comma, timestamps, special values, CRLF."""
    text = (
        "# a comment\n"
        "#\n"
        "\n"
        "# HELP a_total  Help text, with  spaces.\n"
        "# TYPE a_total counter\n"
        "a_total 1 1700000000000\r\n"
        "b{} +Inf\n"
        '  c{ x = "1" , y="2", }\t-Inf  \n'
        "d NaN\n"
        "e -1.5e-3 -5\n"
        "# EOF and other words after a hash are comments\n"
    )
    page = parse(text)
    assert page.types == {"a_total": "counter"}
    a, b, c, d, e = page.samples
    assert a == Sample("a_total", {}, 1.0, 1700000000000)
    assert b == Sample("b", {}, math.inf)
    assert c == Sample("c", {"x": "1", "y": "2"}, -math.inf)
    assert d.name == "d"
    assert math.isnan(d.value)
    assert e == Sample("e", {}, -0.0015, -5)


def test_only_a_newline_ends_a_line() -> None:
    """Other line separators may stand in a label value (only the newline is escaped)."""
    (sample,) = parse('m{v="a\u2028b\x0bc"} 2\n').samples
    assert sample.labels == {"v": "a\u2028b\x0bc"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("metric_without_value\n", "no value"),
        ("1abc 1\n", "no metric name"),
        ("m{a=1} 1\n", 'not name="value"'),
        ('m{a="1" b="2"} 1\n', "not separated by commas"),
        ('m{a="1"\n', "not separated by commas or not closed"),
        ('m{a="1",a="2"} 1\n', "label 'a' twice"),
        ('m{a="\\t"} 1\n', "unknown escape"),
        ("m one\n", "not a number"),
        ("m 1 2.5\n", "not a number"),
        ("m 1 2 3\n", "at most a timestamp"),
        ("# TYPE m\n", "unknown metric type ''"),
        ("# TYPE m gaugee\n", "unknown metric type 'gaugee'"),
        ("# HELP\n", "HELP without a valid metric name"),
        ("# TYPE 9m gauge\n", "TYPE without a valid metric name"),
    ],
)
def test_what_the_format_refuses(text: str, reason: str) -> None:
    """A broken line is a typed error naming the line and what is wrong with it."""
    with pytest.raises(MalformedStreamError, match="Prometheus text format") as caught:
        parse("# TYPE fine gauge\nfine 1\n" + text)
    assert "line 3" in caught.value.message
    assert reason in caught.value.message


_LABEL_NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True)
_METRIC_NAMES = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _written(sample: Sample) -> str:
    """Write a sample as the servers' Prometheus clients do."""
    labels = ",".join(
        f'{name}="{_escaped(value)}"' for name, value in sample.labels.items()
    )
    return f"{sample.name}{{{labels}}} {sample.value!r}"


@given(
    st.lists(
        st.builds(
            Sample,
            _METRIC_NAMES,
            st.dictionaries(_LABEL_NAMES, st.text(), max_size=4),
            st.floats(allow_nan=False),
        ),
        max_size=8,
    ),
    st.sampled_from(sorted(METRIC_TYPES)),
)
def test_written_samples_read_back(samples: list[Sample], kind: str) -> None:
    """Whatever the labels hold, a page written by the format's rules reads back the same."""
    text = "".join(
        f"# TYPE {sample.name} {kind}\n{_written(sample)}\n" for sample in samples
    )
    page = parse(text)
    assert page.samples == tuple(samples)
    assert page.types == dict.fromkeys((sample.name for sample in samples), kind)
