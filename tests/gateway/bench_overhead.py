"""Measure the gateway's overhead: ``in_env python -m tests.gateway.bench_overhead [--rounds N]``.

The measurement (``overhead_run.py``) needs Home Assistant's test harness, so this runs it with
pytest, printing its tables; the harness must load before Home Assistant is imported, hence the
two files. It builds and starts the real llama-server itself (``tests.support.llamacpp``).
``--idle-only`` leaves out the 200 concurrent streams.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import sys

import pytest


def main() -> int:
    """Parse the command line and run the measurement once."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=200, help="pairs of voice commands measured"
    )
    parser.add_argument(
        "--idle-only", action="store_true", help="leave out the concurrent streams"
    )
    args = parser.parse_args()
    os.environ["OVERHEAD_ROUNDS"] = str(args.rounds)
    measurement = Path(__file__).with_name("overhead_run.py")
    options = ["-k", "gateway_overhead"] if args.idle_only else []
    return int(
        pytest.main(
            [
                str(measurement),
                "-q",
                "-s",
                "-p",
                "no:randomly",
                "-p",
                "no:logging",
                *options,
            ]
        )
    )


if __name__ == "__main__":
    sys.exit(main())
