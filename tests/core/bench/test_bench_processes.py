"""A server process on this machine, killed with SIGKILL and started again as it was.

The process is a real one (Python's ``http.server``, started by the test as a server the
benchmark did not start); what the benchmark knows of it comes from ``/proc``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
import signal
import subprocess
import sys

import pytest

from tests.support.llamacpp import free_port
from tools.bench.processes import LocalProcess, listening_pid, process_image, url_port


async def _listening(port: int) -> int:
    """Return the PID listening on ``port`` once one does (bounded by looks: a hang guard)."""
    # A minute at least: a Python start on a loaded machine takes seconds.
    for _ in range(1200):
        pid = await asyncio.to_thread(listening_pid, port)
        if pid is not None:
            return pid
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


async def test_a_local_server_is_killed_and_started_again_as_it_was(
    tmp_path: Path,
) -> None:
    """Found by its port, killed like a crash, started with its command line, folder and environment."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    first = subprocess.Popen(  # noqa: ASYNC220 - a server the benchmark did not start
        command,
        cwd=tmp_path,
        env={**os.environ, "LLM_LANES_TEST_MARK": "kept"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    local: LocalProcess | None = None
    try:
        assert await _listening(port) == first.pid
        local = LocalProcess(url, tmp_path / "logs" / "server-1.log")
        await local.kill()
        assert await asyncio.to_thread(first.wait, 5) == -signal.SIGKILL
        assert listening_pid(port) is None
        await local.kill()  # nothing listens: nothing to do
        await local.start()
        again = await _listening(port)
        assert again == local.restarted != first.pid
        image = process_image(again)
        assert image.argv == tuple(command)
        assert image.cwd == str(tmp_path)
        assert image.env["LLM_LANES_TEST_MARK"] == "kept"
        await local.start()  # it runs: no second one
        assert local.restarted == again == listening_pid(port)
        await local.kill()
        assert listening_pid(port) is None and local.restarted is None
    finally:
        if first.poll() is None:
            first.kill()
        if local is not None and (pid := local.restarted) is not None:
            os.kill(pid, signal.SIGKILL)


def test_a_server_elsewhere_needs_commands(tmp_path: Path) -> None:
    """No process on this machine listens on the URL's port: a clear error, before any run."""
    port = free_port()
    with pytest.raises(
        ValueError, match=f"no process on this machine listens on port {port}"
    ):
        LocalProcess(f"http://127.0.0.1:{port}", tmp_path / "log")
    assert url_port("http://gpu.lan") == 80
    assert url_port("https://gpu.lan/v1") == 443
