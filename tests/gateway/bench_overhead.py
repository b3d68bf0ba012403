"""Measure the gateway's overhead: ``in_env python -m tests.gateway.bench_overhead``.

The measurement (``overhead_run.py``) needs Home Assistant's test harness, so this runs it with
pytest, printing its table; the harness must load before Home Assistant is imported, hence the
two files.
"""

from __future__ import annotations

from pathlib import Path
import sys

import pytest


def main() -> int:
    """Run the measurement once."""
    measurement = Path(__file__).with_name("overhead_run.py")
    return int(
        pytest.main(
            [str(measurement), "-q", "-s", "-p", "no:randomly", "-p", "no:logging"]
        )
    )


if __name__ == "__main__":
    sys.exit(main())
