"""The LLM Lanes engine: scheduler, wire formats, backends and benchmark.

Pure Python on asyncio and aiohttp. Nothing under ``core`` imports ``homeassistant``: the integration modules are thin adapters over it,
and the benchmark CLI reuses it unchanged.

- ``lanes``: what a lane is, and the limits each one enforces; ``settings``: every scheduler knob.
- ``policy``: who runs next (the ``lanes`` and ``fifo`` policies), deciding on ``run_state``: what
  waits and what runs, the fairness counters and the background share's ledger.
- ``scheduler``: carries the decisions out; ``ticket``: one request inside it; ``accounting``:
  what a request is charged; ``snapshot``: the immutable views it hands out.
- ``metrics``, ``quotas``, ``quota_prompts``, ``tokens``, ``errors``: sliding windows, daily
  budgets, what a quota requester's prompt reserves, the token estimate, typed errors.
- ``protocols``: the OpenAI and Ollama wire formats, both directions; ``backends``: the clients
  of each kind of server; ``bench``: workloads, runner, reports, sweeps and the simulated server.
"""
