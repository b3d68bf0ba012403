"""Development tools beside the integration: the simulated LLM server and the benchmark's command line.

Nothing under ``custom_components/llm_lanes/`` (what HACS installs) imports this package; the
tools import the integration's engine, never the other way round (``tests/test_shipped.py``).
"""
