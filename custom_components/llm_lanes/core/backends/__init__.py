"""Clients for LLM servers: the only code that speaks HTTP to them.

- ``base``: the contract (``Backend``, requests, stream chunks, server info, timeouts).
- ``ollama``: Ollama's native API; ``openai``: llama.cpp, vLLM, LM Studio, LocalAI and other
  OpenAI-compatible servers.
- ``detect``: which kind of server answers at a base URL, and the client for it.
- ``transport``: timeouts, streamed answers, and failures turned into typed errors, for both
  clients (the wire formats themselves are ``core.protocols``).
- ``prometheus``: ``/metrics`` of llama.cpp and vLLM.
"""
