"""The LLM Lanes engine: scheduler, backends and benchmark. Pure Python on asyncio and aiohttp.

Nothing under ``core`` imports ``homeassistant``: the integration modules are thin adapters over it,
and the benchmark CLI reuses it unchanged.
"""
