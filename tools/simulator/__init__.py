"""A simulated LLM server (llama.cpp or Ollama) for ``scripts/develop``, the tests and the benchmark.

``server.py`` serves the HTTP APIs, ``engine.py`` models a continuous-batching GPU, ``answers.py``
decides what the simulated model says, ``options.py`` holds the command-line options that shape it
and ``__main__.py`` runs it: ``python -m tools.simulator --port 11434 --slots 4 --speed 1``.
"""
