"""The benchmark's command line (``scripts/bench``, ``python -m tools.bench``) and its measurements.

What ``llm_lanes.run_benchmark`` needs (scenarios, runner, reports, sweeps, calibration, the
batch-cost curve) ships with the integration in ``custom_components/llm_lanes/core/bench/``; this
package adds what only a developer runs: the ``run``, ``sweep``, ``curve`` and ``micro`` commands
(``__main__.py``), the scheduler's micro-benchmark (``micro.py``) and the prefill-delay measurement
behind the README's server advice (``prefill_delay.py``).
"""
