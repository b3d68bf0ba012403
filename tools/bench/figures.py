"""The figures #19 and #20 are judged by, read from a ``scripts/bench run`` output folder.

``python -m tools.bench.figures DIR [DIR ...]`` prints, per run folder: voice TTFT p95 and ITL p95
against idle, background output tokens/s against ``direct``, and background's weighted share of
the service (prompt weight 1, output weight 2) under ``lanes``, with the share it was configured
with. A run over several servers adds a line per policy: its failovers, answers resumed and
requests failed, and per server what it served (per lane, and since its latest start), its
failovers away and to it, and its time off and down.
"""

from __future__ import annotations

import json
from pathlib import Path
import sys
from typing import Any


def figures(folder: Path) -> dict[str, float | None]:
    """Read one run folder's comparison and its ``lanes`` report."""
    comparison = json.loads((folder / "comparison.json").read_text())["runs"]
    lanes = comparison.get("lanes", {})
    report = json.loads((folder / "lanes" / "report.json").read_text())
    service: dict[str, float] = {}
    for requester in report["fairness"]["requesters"].values():
        service[requester["lane"]] = (
            service.get(requester["lane"], 0.0) + requester["service"]
        )
    total = sum(service.values())
    background = next(
        (
            values
            for name, values in lanes.items()
            if isinstance(values, dict)
            and "output_tok_s_vs_direct" in values
            and name in ("summaries", "background", "batch")
        ),
        {},
    )
    voice = lanes.get("voice", {}) if isinstance(lanes.get("voice"), dict) else {}
    return {
        "voice_ttft_p95_vs_idle": voice.get("ttft_p95_vs_idle"),
        "voice_itl_p95_vs_idle": voice.get("itl_p95_vs_idle"),
        "voice_ttft_p95_ms": (voice["ttft_p95"] * 1000)
        if voice.get("ttft_p95")
        else None,
        "background_tok_s_vs_direct": background.get("output_tok_s_vs_direct"),
        "background_share": service.get("background", 0.0) / total if total else None,
        "configured_share": report["settings"]["background_share"],
        "goodput": lanes.get("goodput"),
    }


def server_figures(folder: Path) -> dict[str, dict[str, Any]]:
    """Read each policy's ``servers`` figures of a run folder (none for runs on one server)."""
    result: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*/report.json")):
        report = json.loads(path.read_text())
        if "servers" in report:
            result[path.parent.name] = {
                key: report[key]
                for key in ("failovers", "resumed", "failed", "servers")
            }
    return result


def servers_line(policy: str, figures: dict[str, Any]) -> str:
    """Render one policy's ``server_figures`` as a line."""
    parts = [
        (
            f"{policy}: failovers {figures['failovers']}, resumed {figures['resumed']}, "
            f"failed {figures['failed']}"
        )
    ]
    for name, server in figures["servers"].items():
        lanes = ", ".join(f"{lane} {count}" for lane, count in server["served"].items())
        since = (
            f", {server['served_since_start']} since its start"
            if server["starts"]
            else ""
        )
        down = "" if server["down_s"] is None else f", down {server['down_s']:.0f} s"
        parts.append(
            f"server {name}: served {server['served_total']} ({lanes}){since}, "
            f"away {server['failovers_from']} / to {server['failovers_to']}, "
            f"off {server['off_s']:.0f} s{down}"
        )
    return "; ".join(parts)


def main(argv: list[str]) -> int:
    """Print the figures of each folder named."""
    for name in argv:
        values = figures(Path(name))
        shown = ", ".join(
            f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
            for key, value in values.items()
        )
        print(f"{name}: {shown}")
        for policy, pool in server_figures(Path(name)).items():
            print(f"{name} {servers_line(policy, pool)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
