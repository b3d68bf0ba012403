"""Command-line options that shape a simulated server, shared by the simulator's and the benchmark's."""

from __future__ import annotations

import argparse
from typing import Any

from tools.simulator.costs import COSTS, DEFAULT_PROFILE
from tools.simulator.server import SimConfig


def add_sim_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add the options that shape a simulated server: ``--<prefix>kind``, ``--<prefix>slots`` ..."""
    defaults = SimConfig()
    option = f"--{prefix}"
    parser.add_argument(
        f"{option}kind", choices=["llama_cpp", "ollama"], default=defaults.kind
    )
    parser.add_argument(f"{option}slots", type=int, default=defaults.slots)
    parser.add_argument(
        f"{option}speed", type=float, default=defaults.speed,
        help="simulated time runs this much faster",
    )  # fmt: skip
    parser.add_argument(
        f"{option}costs", choices=sorted(COSTS), default=DEFAULT_PROFILE,
        help="the server's costs (tools/simulator/costs.py): gpu-published (the default), "
        "gpu (an H200, fitted), gpu-fa-off (it without flash attention) or cpu",
    )  # fmt: skip
    parser.add_argument(f"{option}seed", type=int, default=defaults.seed)
    parser.add_argument(
        f"{option}kv-capacity", type=int, default=defaults.kv_capacity_tokens
    )
    parser.add_argument(
        f"{option}prefill-chunk", type=int, default=defaults.prefill_chunk_tokens,
        help="prompt tokens per iteration; 0 for unlimited",
    )  # fmt: skip


def sim_config(args: argparse.Namespace, prefix: str = "", **others: Any) -> SimConfig:
    """Build the ``SimConfig`` the options of ``add_sim_options`` describe (plus ``others``)."""
    name = prefix.replace("-", "_")

    def value(key: str) -> Any:
        return getattr(args, f"{name}{key}")

    return SimConfig(
        kind=value("kind"),
        slots=value("slots"),
        speed=value("speed"),
        seed=value("seed"),
        kv_capacity_tokens=value("kv_capacity"),
        prefill_chunk_tokens=value("prefill_chunk") or None,
        costs=COSTS[value("costs")],
        **others,
    )
