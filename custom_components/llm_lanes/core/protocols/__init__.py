"""The wire formats the engine speaks, in both directions: one module per protocol.

- ``openai``: ``/v1/chat/completions`` with server-sent events (llama.cpp, vLLM, LM Studio,
  LocalAI and every OpenAI-compatible client);
- ``ollama``: ``/api/chat`` with NDJSON lines.

Each converts the neutral ``ChatRequest`` / ``StreamChunk`` of ``core.backends.base`` to and from
its format. The client side (a request body out, the server's stream in) is used by the backends;
the server side (a client's request in, stream chunks and whole answers out) by the gateway that
serves these endpoints from Home Assistant. ``common`` holds what both formats share, and the
``StreamDecoder`` / ``StreamEncoder`` interfaces both implement. A malformed request raises
``core.errors.InvalidRequestError`` naming the bad field.
"""
