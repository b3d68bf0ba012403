"""Tests of the gateway: OpenAI- and Ollama-compatible endpoints, with real clients."""
