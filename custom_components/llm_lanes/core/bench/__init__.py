"""The goodput benchmark as ``llm_lanes.run_benchmark`` runs it: scenarios, runner, reports, calibration.

Only what Home Assistant runs ships here (the built-in scenarios, the runner, reports, sweeps,
fairness, the batch-cost curve and the calibration that ties them together). The simulated server
and the ``scripts/bench`` command line live beside the integration, in ``tools/``.
"""
