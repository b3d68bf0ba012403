"""The wire formats the engine speaks, in both directions: two modules per protocol.

- OpenAI: ``/v1/chat/completions`` with server-sent events (llama.cpp, vLLM, LM Studio,
  LocalAI and every OpenAI-compatible client);
- Ollama: ``/api/chat`` with NDJSON lines.

Each converts the neutral ``ChatRequest`` / ``StreamChunk`` of ``core.model`` to and from
its format. ``openai_requests`` and ``ollama_requests`` hold a format's request bodies: the
backends write them, the gateway that serves these endpoints from Home Assistant reads a
client's. ``openai_answers`` and ``ollama_answers`` hold its answers: the backends read a
server's stream, the gateway writes stream chunks and whole answers. ``common`` holds what both
formats share, and the ``StreamDecoder`` / ``StreamEncoder`` interfaces both implement;
``fields`` reads a client's request field by field (a malformed one raises
``core.errors.InvalidRequestError`` naming the bad field).
"""
