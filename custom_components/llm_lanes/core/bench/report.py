"""Turn a run into figures: report.json, report.csv, report.md and PNG plots.

Definitions (times in scenario seconds):

* a class's requests are those sent after the warm-up; ``finished`` ones completed normally;
* ``ttft``: from sending to the first output chunk; ``itl``: gaps between output chunks, pooled
  over the class's finished requests; ``e2e``: sending to the last chunk;
* ``goodput``: the fraction of finished requests whose TTFT met the class's ``ttft_s`` and whose
  own p95 gap met its ``itl_s``; ``good_per_s``: those requests per second of the measured window;
* ``output_tok_s``: output tokens received in the window (warm-up to end) per second;
* ``prompt_tokens_evaluated`` / ``prompt_tokens_cached``: of the finished requests' prompt
  tokens, those the server evaluated and those it took from its prompt cache (where it says:
  llama.cpp, vLLM; Ollama reports what it evaluated);
* ``fairness``: each requester's weighted service in the window (partial service included) and
  Jain's index over the backlogged requesters, per lane and overall (``fairness.py``);
  ``jain_index`` is the overall one.

A few figures go beyond the issue's schema: at the top level ``goodput`` (requests that met
their objectives over all requests sent, rejected and failed ones included, those cut off by the
end of the run excluded) and ``good_per_s``; per class
``output_tok_s`` (its output tokens received in the window, per second).

A run over several servers (or one the scenario stops and starts) adds ``servers``: per server,
by its number, its URL and what it said of itself, and what it did over the whole run, warm-up
included (``ServerTally``: requests served per lane, tokens, failovers away from it and to it,
answers resumed there, seconds off, and the seconds down, asleep and waking as the pool saw it);
``failovers``, every move of a request to another server; ``resumed``, answers another server
continued; ``failed``, requests sent after the warm-up that ended without an answer (an error, or
refused: a busy server's 503, a full queue), those cut off by the end of the run excluded (none
is the aim).

matplotlib is imported only when a plot is drawn: it is a development tool, not a requirement
of the integration.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
import csv
from dataclasses import fields
import json
from pathlib import Path
from typing import Any

from custom_components.llm_lanes.core import metrics
from custom_components.llm_lanes.core.bench.fairness import fairness
from custom_components.llm_lanes.core.bench.runner import (
    RequestRecord,
    RunResult,
    ServerRun,
)
from custom_components.llm_lanes.core.bench.workload import RequestClass
from custom_components.llm_lanes.core.settings import SchedulerSettings
from custom_components.llm_lanes.core.snapshot import FinishedRequest

CLASS_FIELDS = (
    "count", "finished", "rejected", "preempted",
    "ttft_p50", "ttft_p90", "ttft_p95", "ttft_p99",
    "itl_p50", "itl_p95", "itl_p99", "itl_max",
    "e2e_p50", "e2e_p95", "queue_wait_p95",
    "prompt_tokens", "prompt_tokens_evaluated", "prompt_tokens_cached",
    "output_tokens", "goodput", "good_per_s",
)  # fmt: skip


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100), as the scheduler's; None for no values."""
    return metrics.percentile(sorted(values), q / 100) if values else None


def settings_dict(settings: SchedulerSettings) -> dict[str, Any]:
    """Return the settings as plain JSON values."""
    result: dict[str, Any] = {}
    for item in fields(settings):
        value = getattr(settings, item.name)
        if item.name == "lanes":
            value = {
                lane.key: {f.name: getattr(limits, f.name) for f in fields(limits)}
                for lane, limits in value.items()
            }
        elif item.name == "requester_quotas":
            value = dict(value)
        elif hasattr(value, "value"):
            value = value.value
        result[item.name] = value
    return result


def meets_objectives(record: RequestRecord, cls: RequestClass) -> bool:
    """Whether a finished request met both its TTFT and its ITL objective."""
    if record.outcome != "ok" or record.ttft_s is None:
        return False
    itl_p95 = percentile(record.gaps, 95)
    return record.ttft_s <= cls.slo.ttft_s and (
        itl_p95 is None or itl_p95 <= cls.slo.itl_s
    )


def objective_misses(result: RunResult, class_name: str) -> tuple[int, int, int]:
    """(finished, missed the TTFT objective, missed the ITL objective) of one class after warm-up."""
    cls = next(c for c in result.scenario.classes if c.name == class_name)
    finished = [
        r
        for r in result.records
        if r.class_name == class_name
        and r.outcome == "ok"
        and r.sent_at >= result.scenario.warmup_s
    ]
    missed_ttft = sum(
        1 for r in finished if r.ttft_s is None or r.ttft_s > cls.slo.ttft_s
    )
    missed_itl = sum(
        1
        for r in finished
        if (p95 := percentile(r.gaps, 95)) is not None and p95 > cls.slo.itl_s
    )
    return len(finished), missed_ttft, missed_itl


def build_report(result: RunResult) -> dict[str, Any]:
    """Build the report.json object of one run (the measured window: after warm-up, to the end)."""
    scenario = result.scenario
    window = scenario.duration_s - scenario.warmup_s
    measured = [r for r in result.records if r.sent_at >= scenario.warmup_s]
    scheduled: dict[str, list[FinishedRequest]] = defaultdict(list)
    for owner, finished in result.finished:
        scheduled[owner].append(finished)
    classes: dict[str, dict[str, Any]] = {}
    good_total = 0
    for cls in scenario.classes:
        classes[cls.name], good = _class_report(
            result, cls, measured, scheduled.get(cls.name, []), window
        )
        good_total += good
    output_tokens = _tokens_in_window(
        result.records, scenario.warmup_s, scenario.duration_s
    )
    prompt_tokens = _prompt_tokens_in_window(result)
    # Requests cut off by the end of the run (closed loops, the drain limit) are neither good nor bad.
    counted = [r for r in measured if r.outcome != "cancelled"]
    served = fairness(
        result.records,
        {cls.name: cls.lane for cls in scenario.classes},
        result.settings,
        scenario.warmup_s,
        scenario.duration_s,
    )
    return {
        "scenario": scenario.name,
        "policy": result.policy,
        "settings": settings_dict(result.settings),
        "server": {
            "kind": result.server.kind,
            "version": result.server.version,
            "model": result.server.model,
            "slots": result.server.slots,
        },
        "duration_s": window,
        "output_tok_s": output_tokens / window,
        "prompt_tok_s": prompt_tokens / window,
        "classes": classes,
        "queue_depth_max": result.queue_depth_max,
        "kv_use_max": result.kv_use_max,
        "jain_index": served["jain_backlogged"],
        "fairness": served,
        "goodput": good_total / len(counted) if counted else None,
        "good_per_s": good_total / window,
        **_servers_report(result.servers, measured),
    }


def _servers_report(
    servers: Sequence[ServerRun], measured: Sequence[RequestRecord]
) -> dict[str, Any]:
    """Return the report's ``servers``, ``failovers``, ``resumed`` and ``failed`` (nothing for one server)."""
    if not servers:
        return {}
    tallies = [run.tally for run in servers]
    return {
        "servers": {
            run.server.name: {
                "url": run.server.backend.base_url,
                "kind": run.server.description.kind,
                "model": run.server.description.model,
                "slots": run.server.description.slots,
                **run.tally.as_dict(),
            }
            for run in servers
        },
        "failovers": sum(tally.failovers_to for tally in tallies),
        "resumed": sum(tally.resumed_here for tally in tallies),
        "failed": sum(
            1 for record in measured if record.outcome in ("error", "rejected")
        ),
    }


def _class_report(
    result: RunResult,
    cls: RequestClass,
    measured: Sequence[RequestRecord],
    scheduled: Sequence[FinishedRequest],
    window: float,
) -> tuple[dict[str, Any], int]:
    """Return one class's figures (``CLASS_FIELDS`` and its tokens/s) and its good requests.

    ``measured`` are the run's requests sent after warm-up, ``scheduled`` what the scheduler
    reported of the class's requests (queue waits, preemptions), ``window`` the measured seconds.
    """
    scenario = result.scenario
    records = [r for r in measured if r.class_name == cls.name]
    ok = [r for r in records if r.outcome == "ok"]
    good = [r for r in ok if meets_objectives(r, cls)]
    waits = [f.queue_wait_s for f in scheduled]
    stats = {
        "count": len(records),
        "finished": len(ok),
        "rejected": sum(1 for r in records if r.outcome == "rejected"),
        "preempted": sum(1 for f in scheduled if f.preemptions > 0),
        **_latencies(ok),
        "queue_wait_p95": percentile(waits, 95) if result.policy != "direct" else None,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        **_cache_use(ok),
        "output_tokens": sum(r.output_tokens for r in ok),
        "goodput": len(good) / len(ok) if ok else None,
        "good_per_s": len(good) / window,
        "output_tok_s": _tokens_in_window(
            (r for r in result.records if r.class_name == cls.name),
            scenario.warmup_s,
            scenario.duration_s,
        )
        / window,
    }
    return stats, len(good)


def _latencies(ok: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Return the TTFT, inter-token and end-to-end percentiles of the requests that finished."""
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    gaps = [gap for r in ok for gap in r.gaps]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    return {
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p90": percentile(ttfts, 90),
        "ttft_p95": percentile(ttfts, 95),
        "ttft_p99": percentile(ttfts, 99),
        "itl_p50": percentile(gaps, 50),
        "itl_p95": percentile(gaps, 95),
        "itl_p99": percentile(gaps, 99),
        "itl_max": max(gaps) if gaps else None,
        "e2e_p50": percentile(e2es, 50),
        "e2e_p95": percentile(e2es, 95),
    }


def _prompt_tokens_in_window(result: RunResult) -> int:
    """Return the prompt tokens of the requests whose first token came in the measured window."""
    start, end = result.scenario.warmup_s, result.scenario.duration_s
    return sum(
        record.prompt_tokens
        for record in result.records
        if record.token_times and start <= record.token_times[0] <= end
    )


def _tokens_in_window(
    records: Iterable[RequestRecord], start: float, end: float
) -> int:
    return sum(
        count
        for record in records
        for at, count in zip(record.token_times, record.token_counts, strict=True)
        if start <= at <= end
    )


def _cache_use(records: Sequence[RequestRecord]) -> dict[str, int | None]:
    """Prompt tokens the server evaluated and took from its cache (None: it did not say).

    Ollama says what it evaluated, not what it reused.
    """
    evaluated = [r.evaluated_prompt_tokens for r in records]
    cached = [r.cached_prompt_tokens for r in records]
    return {
        "prompt_tokens_evaluated": _sum_known(evaluated),
        "prompt_tokens_cached": _sum_known(cached),
    }


def _sum_known(values: Sequence[int | None]) -> int | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


# --- files --------------------------------------------------------------------------------------


def write_report(
    result: RunResult, out_dir: Path, *, plots: bool = True
) -> dict[str, Any]:
    """Write report.json, report.csv, report.md (and ttft_cdf.png) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = build_report(result)
    (out_dir / "report.json").write_text(
        json.dumps(report, indent=2) + "\n", encoding="utf-8"
    )
    with (out_dir / "report.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["scenario", "policy", "class", *CLASS_FIELDS])
        for name, stats in report["classes"].items():
            writer.writerow(
                [
                    report["scenario"],
                    report["policy"],
                    name,
                    *(stats[k] for k in CLASS_FIELDS),
                ]
            )
    (out_dir / "report.md").write_text(markdown_report(report), encoding="utf-8")
    if plots:
        plot_ttft_cdf([result], out_dir / "ttft_cdf.png")
    return report


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if unit == "s":
            return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
        if unit == "%":
            return f"{value:.0%}"
        return f"{value:.1f}"
    return str(value)


def markdown_report(report: dict[str, Any]) -> str:
    """Render a readable summary of one report."""
    server = report["server"]
    lines = [
        f"# {report['scenario']} — policy `{report['policy']}`",
        "",
        (
            f"Server: {server['kind']} {server['version'] or ''} · model `{server['model']}` · "
            f"{server['slots'] or '?'} slots. Measured window: {report['duration_s']:.0f} s."
        ),
        "",
        (
            f"Output {report['output_tok_s']:.1f} tok/s · prompt {report['prompt_tok_s']:.1f} tok/s · "
            f"goodput {_fmt(report['goodput'], '%')} ({report['good_per_s']:.2f} good requests/s) · "
            f"max queue {report['queue_depth_max']} · max KV use {_fmt(report['kv_use_max'], '%')} · "
            f"Jain index {_fmt(report['jain_index'])}"
        ),
        "",
        "| class | sent | finished | rejected | TTFT p50 | TTFT p95 | ITL p50 | ITL p95 | e2e p95 | queue p95 | goodput | prompt evaluated / cached |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in report["classes"].items():
        cache = " / ".join(
            "–" if c[key] is None else f"{c[key]:,}"
            for key in ("prompt_tokens_evaluated", "prompt_tokens_cached")
        )
        lines.append(
            f"| {name} | {c['count']} | {c['finished']} | {c['rejected']} | "
            f"{_fmt(c['ttft_p50'], 's')} | {_fmt(c['ttft_p95'], 's')} | {_fmt(c['itl_p50'], 's')} | "
            f"{_fmt(c['itl_p95'], 's')} | {_fmt(c['e2e_p95'], 's')} | {_fmt(c['queue_wait_p95'], 's')} | "
            f"{_fmt(c['goodput'], '%')} | {cache} |"
        )
    lanes = report["fairness"]["jain_backlogged_by_lane"]
    if lanes:
        lines += [
            "",
            "Jain index over backlogged requesters: "
            + ", ".join(f"{lane} {_fmt(value)}" for lane, value in lanes.items()),
        ]
    if "servers" in report:
        lines += ["", *_servers_markdown(report)]
    return "\n".join(lines) + "\n"


def _servers_markdown(report: dict[str, Any]) -> list[str]:
    """Render the servers of a run over several: what each served, its failovers, its time off."""
    lines = [
        (
            f"Servers (whole run): {report['failovers']} failovers, "
            f"{report['resumed']} answers resumed on another server, "
            f"{report['failed']} requests failed."
        ),
        "",
        "| server | | served | voice / interactive / automation / background | since its last start | tokens in / out | failovers away / to | resumed here | off | down / asleep / waking (pool) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, server in report["servers"].items():
        served = server["served"]
        per_lane = " / ".join(
            str(served.get(lane, 0))
            for lane in ("voice", "interactive", "automation", "background")
        )
        states = (
            "–"
            if server["down_s"] is None
            else " / ".join(
                f"{server[key]:.0f} s" for key in ("down_s", "asleep_s", "waking_s")
            )
        )
        lines.append(
            f"| {name} | {server['kind']} `{server['url']}` | {server['served_total']} | "
            f"{per_lane} | {server['served_since_start'] if server['starts'] else '–'} | "
            f"{server['prompt_tokens']:,} / {server['output_tokens']:,} | "
            f"{server['failovers_from']} / {server['failovers_to']} | {server['resumed_here']} | "
            f"{server['off_s']:.0f} s | {states} |"
        )
    return lines


# --- plots --------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib as mpl  # noqa: PLC0415  (a development tool, not a runtime requirement)

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def plot_ttft_cdf(
    results: Sequence[RunResult], path: Path, *, labels: Sequence[str] | None = None
) -> None:
    """TTFT CDF of every class, one line per class and run (policy)."""
    plt = _pyplot()
    classes = [cls.name for cls in results[0].scenario.classes]
    fig, axes = plt.subplots(
        1, len(classes), figsize=(5 * len(classes), 4), squeeze=False
    )
    for axis, name in zip(axes[0], classes, strict=True):
        for index, result in enumerate(results):
            warmup = result.scenario.warmup_s
            ttfts = sorted(
                r.ttft_s
                for r in result.records
                if r.class_name == name
                and r.outcome == "ok"
                and r.ttft_s is not None
                and r.sent_at >= warmup
            )
            if not ttfts:
                continue
            label = labels[index] if labels else result.policy
            axis.step(
                ttfts,
                [(i + 1) / len(ttfts) for i in range(len(ttfts))],
                where="post",
                label=label,
            )
        axis.set_xscale("log")
        axis.set_title(f"TTFT — {name}")
        axis.set_xlabel("seconds")
        axis.set_ylabel("fraction of requests")
        axis.grid(visible=True, alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_goodput(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Goodput and output tokens/s of each swept setting (one bar pair per combination)."""
    plt = _pyplot()
    labels = [row["label"] for row in rows]
    fig, left = plt.subplots(
        figsize=(max(6.0, 0.9 * len(rows) + 2), 4.8), layout="constrained"
    )
    positions = list(range(len(rows)))
    left.bar(
        [p - 0.2 for p in positions],
        [row["goodput"] or 0 for row in rows],
        width=0.4,
        label="goodput",
        color="tab:green",
    )
    left.set_ylabel("goodput (share of requests meeting objectives)")
    left.set_ylim(0, 1.05)
    right = left.twinx()
    right.bar(
        [p + 0.2 for p in positions],
        [row["output_tok_s"] for row in rows],
        width=0.4,
        label="output tok/s",
        color="tab:blue",
    )
    right.set_ylabel("output tokens/s")
    left.set_xticks(positions)
    left.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    left.set_title("Goodput and throughput of each setting")
    fig.legend(loc="outside lower center", ncols=2)
    fig.savefig(path, dpi=100)
    plt.close(fig)
