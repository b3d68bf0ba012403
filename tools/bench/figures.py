"""The figures #19 is judged by, read from a ``scripts/bench run`` output folder.

``python -m tools.bench.figures DIR [DIR ...]`` prints, per run folder: voice TTFT p95 and ITL p95
against idle, background output tokens/s against ``direct``, and background's weighted share of
the service (prompt weight 1, output weight 2) under ``lanes``, with the share it was configured
with.
"""

from __future__ import annotations

import json
from pathlib import Path
import sys


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


def main(argv: list[str]) -> int:
    """Print the figures of each folder named."""
    for name in argv:
        values = figures(Path(name))
        shown = ", ".join(
            f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
            for key, value in values.items()
        )
        print(f"{name}: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
