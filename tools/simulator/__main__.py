"""Command line of the simulated server (``scripts/develop`` runs it).

python -m tools.simulator [--host 127.0.0.1] [--port 8080] [--kind llama_cpp|ollama] [--slots 4] [--speed 1] ...
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
import contextlib
import logging

from tools.simulator.options import add_sim_options, sim_config
from tools.simulator.server import SimConfig, SimulatedServer

_LOGGER = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """Options of the simulator's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.simulator",
        description="Run a simulated LLM server (llama.cpp-like by default, or Ollama).",
    )
    defaults = SimConfig()
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--model", default=defaults.model)
    add_sim_options(parser)
    parser.add_argument("--max-queue", type=int, default=None)
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Turn parsed options into a ``SimConfig``."""
    return sim_config(
        args,
        model=args.model,
        max_queue=args.max_queue,
        host=args.host,
        port=args.port,
    )


async def serve_forever(
    config: SimConfig, ready: Callable[[str], Awaitable[None]] | None = None
) -> None:
    """Run the server until cancelled."""
    async with SimulatedServer(config) as sim:
        if ready is not None:
            await ready(sim.url)
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    async def announce(url: str) -> None:
        _LOGGER.info(
            "simulated %s server (%d slots, speed %g, model %s) listening on %s",
            config.kind, config.slots, config.speed, config.model, url,
        )  # fmt: skip

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(config, announce))


if __name__ == "__main__":
    main()
