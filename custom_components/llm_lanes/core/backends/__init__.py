"""Clients for LLM servers: the only code that speaks HTTP to them.

- ``base``: the contract (``Backend``, server kinds, server info, timeouts).
- ``kinds``: one description per kind of server (``ServerProfile``): its name, the API it
  speaks, how it is detected, what requests may carry, whether it unloads models, where it
  reports itself. Everything below reads it; adding a kind is adding its description.
- ``ollama``: Ollama's native API; ``openai``: llama.cpp, vLLM, LM Studio, LocalAI and other
  OpenAI-compatible servers; both are ``http_backend.HttpBackend``s (a server of their API,
  reached through one ``transport.HttpClient``).
- ``detect``: which kind of server answers at a base URL (the descriptions' ``probes``), and the
  client for it.
- ``reports``: where an OpenAI-compatible server reports its version, context, slots and load;
  ``prometheus``: what ``/metrics`` of llama.cpp and vLLM says, read by ``prometheus_text``
  (the Prometheus text format).
- ``transport``: timeouts, streamed answers, and failures turned into typed errors, for both
  clients (the wire formats themselves are ``core.protocols``).
"""
