"""Measure how llama.cpp's batch flags bound a voice command's wait behind a long prefill.

``--batch-size`` / ``--ubatch-size`` on the real llama-server the tests build (the README's
server advice).

    source scripts/lib/env.sh && in_env python scripts/lib/server_advice.py [--samples 40]

For each pair of flags a fresh server starts (4 slots, 4,096 tokens each, 2 threads); a
voice-sized request's time to first token is measured alone and while a ~3,000-token prompt is
being prefilled (``tools/bench/prefill_delay.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
import sys

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from custom_components.llm_lanes.core.backends.detect import connect  # noqa: E402
from tests.support.llamacpp import LlamaServer  # noqa: E402
from tools.bench.prefill_delay import measure_prefill_delay  # noqa: E402

FLAGS = (
    ("2048", "512"),  # llama.cpp's defaults
    ("512", "512"),
    ("256", "256"),
    ("128", "128"),
)


async def main(samples: int) -> None:
    """Start a server per pair of flags, measure, print the table."""
    rows = []
    for batch, ubatch in FLAGS:
        server = LlamaServer(
            parallel=4,
            context_per_slot=4096,
            extra_args=("--batch-size", batch, "--ubatch-size", ubatch),
        )
        async with server, aiohttp.ClientSession() as session:
            backend = await connect(session, server.url)
            delay = await measure_prefill_delay(
                backend, server.model_name, samples=samples, background_words=500
            )
        row = {"batch_size": batch, "ubatch_size": ubatch, **delay.as_dict()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        "\n| --batch-size / --ubatch-size | background prefill | voice TTFT p95 alone | beside the prefill | ratio |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        ratio = row["loaded_p95_s"] / row["idle_p95_s"]
        print(
            f"| {row['batch_size']} / {row['ubatch_size']} | {row['background_prefill_s'] * 1000:.0f} ms "
            f"| {row['idle_p95_s'] * 1000:.1f} ms | {row['loaded_p95_s'] * 1000:.1f} ms | {ratio:.2f}x |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=40)
    asyncio.run(main(parser.parse_args().samples))
