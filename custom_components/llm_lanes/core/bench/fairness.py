"""How fairly a run served its requesters: weighted service in the window, and Jain's index.

A requester's service is what the Virtual Token Counter charges: prompt tokens times the input
weight plus output tokens times the output weight, counted when they were served inside the
measured window (a prompt when its first token came, each output token when it came), so the
partial service of requests still running at the end counts too.

Fairness only means something between requesters that wanted service all along: Jain's index
(1 when all got the same, 1/n when one got everything) is taken over the requesters that were
*backlogged* — had a request outstanding for at least ``BACKLOGGED_SHARE`` of the window — of one
lane (lanes rank their requests on purpose; fairness is promised inside a lane), and over all of
them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from custom_components.llm_lanes.core.bench.runner import RequestRecord
from custom_components.llm_lanes.core.lanes import Lane
from custom_components.llm_lanes.core.settings import SchedulerSettings

BACKLOGGED_SHARE = 0.9
"""A requester with a request outstanding for this share of the window counts as backlogged."""


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index of some amounts (None for fewer than two, or all zero)."""
    if len(values) < 2 or not any(values):
        return None
    return sum(values) ** 2 / (len(values) * sum(value * value for value in values))


def service(
    record: RequestRecord, settings: SchedulerSettings, start: float, end: float
) -> float:
    """Weighted service a request received between ``start`` and ``end``."""
    served = 0.0
    if record.token_times and start <= record.token_times[0] <= end:
        served += settings.input_weight * record.prompt_tokens
    served += settings.output_weight * sum(
        count
        for at, count in zip(record.token_times, record.token_counts, strict=True)
        if start <= at <= end
    )
    return served


def backlogged_share(
    records: Iterable[RequestRecord], start: float, end: float
) -> float:
    """Share of the window during which at least one of the records was outstanding."""
    intervals = sorted(
        (
            max(start, r.sent_at),
            min(end, r.sent_at + r.e2e_s if r.e2e_s is not None else end),
        )
        for r in records
    )
    covered = 0.0
    reach = start
    for low, high in intervals:
        if high <= reach:
            continue
        covered += high - max(low, reach)
        reach = high
    return covered / (end - start) if end > start else 0.0


def fairness(
    records: Sequence[RequestRecord],
    lanes: Mapping[str, Lane],
    settings: SchedulerSettings,
    start: float,
    end: float,
) -> dict[str, Any]:
    """Service per requester, and Jain's index over the backlogged ones (per lane and overall).

    ``lanes`` gives each record's lane by class name.
    """
    by_requester: dict[tuple[Lane, str], list[RequestRecord]] = defaultdict(list)
    for record in records:
        by_requester[lanes[record.class_name], record.requester].append(record)
    requesters: dict[str, dict[str, Any]] = {}
    backlogged: dict[Lane, list[float]] = defaultdict(list)
    for (lane, requester), own in sorted(by_requester.items()):
        served = sum(service(record, settings, start, end) for record in own)
        share = backlogged_share(own, start, end)
        requesters[requester] = {
            "lane": lane.key,
            "service": served,
            "backlogged_share": share,
        }
        if share >= BACKLOGGED_SHARE:
            backlogged[lane].append(served)
    return {
        "requesters": requesters,
        "jain_backlogged": jain(
            [value for values in backlogged.values() for value in values]
        ),
        "jain_backlogged_by_lane": {
            lane.key: jain(values) for lane, values in sorted(backlogged.items())
        },
    }
