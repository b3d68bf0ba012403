"""Soak the gateway: ``in_env python -m tests.gateway.soak --requests 5000 --concurrency 16``.

The run (``soak_run.py``) needs Home Assistant's test harness, so this runs it with pytest,
printing its table (outcomes by request kind; any error fails it); the harness must load before
Home Assistant is imported, hence the two files. It builds and starts the real llama-server
itself (``tests.support.llamacpp``). Run it on an idle machine: on a busy one, deadlines are
what is measured.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import sys

import pytest


def main() -> int:
    """Parse the command line and run the soak once."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests to send")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="requests in flight at once"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=8, help="output tokens of each answer"
    )
    args = parser.parse_args()
    os.environ["SOAK_REQUESTS"] = str(args.requests)
    os.environ["SOAK_CONCURRENCY"] = str(args.concurrency)
    os.environ["SOAK_MAX_TOKENS"] = str(args.max_tokens)
    run = Path(__file__).with_name("soak_run.py")
    return int(
        pytest.main([str(run), "-q", "-s", "-p", "no:randomly", "-p", "no:logging"])
    )


if __name__ == "__main__":
    sys.exit(main())
