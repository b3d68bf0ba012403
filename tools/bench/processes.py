"""A server process on this machine, killed as a crash kills it and started again as it was.

``scripts/bench run --server http://127.0.0.1:8090 --scenario failover_evening`` kills and starts a
real server the benchmark did not start: the process listening on the URL's port is found in
``/proc`` (Linux), its command line, working directory and environment are read before it is
killed with SIGKILL, and ``start`` runs that command line again, in its own session, its output
in a log file. A server the benchmark restarted outlives it (``restarted`` says which, to stop it
afterwards): the machine is left as it was found, with the server running.

``ShellCommands`` does the same with the user's own commands (``--server-kill N=CMD``,
``--server-start N=CMD``), for a server on another machine or one a service manager runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
import os
from pathlib import Path
import signal
import subprocess
from typing import IO
from urllib.parse import urlsplit

from custom_components.llm_lanes.core.bench.servers import PowerSwitch

GONE_LIMIT_S = 10.0
"""How long a killed process is given to let go of its port."""
_LISTEN = "0A"
"""A listening socket's state in ``/proc/net/tcp``."""


def url_port(url: str) -> int:
    """Return the TCP port of a URL (its scheme's default when it names none)."""
    parts = urlsplit(url)
    if parts.port is not None:
        return parts.port
    return 443 if parts.scheme == "https" else 80


def listening_pid(port: int) -> int | None:
    """Return the process listening on TCP ``port`` on this machine (None: none, or not Linux)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if str(fd.readlink()) in inodes:
                    return int(entry.name)
        except OSError:
            continue  # gone, or not ours to read
    return None


@dataclass(frozen=True, slots=True)
class ProcessImage:
    """What starts a process again as it was."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]


def process_image(pid: int) -> ProcessImage:
    """Read a running process's command line, working directory and environment."""
    root = Path(f"/proc/{pid}")
    argv = tuple(
        part.decode(errors="surrogateescape")
        for part in (root / "cmdline").read_bytes().split(b"\0")
        if part
    )
    env: dict[str, str] = {}
    for item in (root / "environ").read_bytes().split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="surrogateescape")] = value.decode(
                errors="surrogateescape"
            )
    return ProcessImage(argv=argv, cwd=_own_path(root), env=env)


def _own_path(root: Path) -> str:
    """Return a process's working directory as a path of this process's file system.

    A process in another chroot (another ``in_env`` command) shows its paths from the host's
    root: the part that is its root's own path is taken off; a directory that is not here is
    replaced by this process's own.
    """
    cwd = str((root / "cwd").readlink())
    own_root = str((root / "root").readlink())
    if own_root != "/" and (cwd == own_root or cwd.startswith(f"{own_root}/")):
        cwd = cwd[len(own_root) :] or "/"
    return cwd if Path(cwd).is_dir() else str(Path.cwd())


class LocalProcess:
    """The process serving a URL on this machine (see the module docstring)."""

    def __init__(self, url: str, log: Path) -> None:
        """Find the process listening on ``url``'s port (ValueError: none does)."""
        self.url = url
        self.port = url_port(url)
        self.log = log
        pid = listening_pid(self.port)
        if pid is None:
            raise ValueError(
                f"no process on this machine listens on port {self.port} of {url}: the "
                "benchmark cannot kill or start it (give --server-kill and --server-start "
                "commands for a server elsewhere)"
            )
        self._image = process_image(pid)
        self._child: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None

    @property
    def restarted(self) -> int | None:
        """The PID of the server the benchmark started and left running (None: none)."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def switch(self) -> PowerSwitch:
        """Return the switch the benchmark kills and starts the server with."""
        return PowerSwitch(kill=self.kill, start=self.start)

    async def kill(self) -> None:
        """SIGKILL the process listening on the port; return once the port is free."""
        pid = await asyncio.to_thread(listening_pid, self.port)
        if pid is None:
            return
        self._image = await asyncio.to_thread(process_image, pid)
        os.kill(pid, signal.SIGKILL)
        child = self._child
        if child is not None and child.pid == pid:
            await asyncio.to_thread(child.wait)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GONE_LIMIT_S
        while await asyncio.to_thread(listening_pid, self.port) is not None:
            if loop.time() > deadline:
                raise TimeoutError(f"port {self.port} is still taken after SIGKILL")
            await asyncio.sleep(0.05)

    async def start(self) -> None:
        """Start the server's command line again (nothing if one still runs or starts)."""
        if self.restarted is not None:
            return
        if await asyncio.to_thread(listening_pid, self.port) is not None:
            return
        image = self._image
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if self._output is not None:
            self._output.close()
        self._output = self.log.open("ab")
        self._child = subprocess.Popen(  # noqa: ASYNC220 - returns at once; the server runs on
            image.argv,
            cwd=image.cwd,
            env=image.env,
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class ShellCommands:
    """A server killed and started by the user's shell commands (see the module docstring)."""

    def __init__(self, kill: str, start: str, log: Path) -> None:
        """``kill`` runs to its end; ``start`` is launched and left running (it may be the server)."""
        self._kill = kill
        self._start = start
        self.log = log
        self._launched: list[subprocess.Popen[bytes]] = []

    def switch(self) -> PowerSwitch:
        """Return the switch the benchmark kills and starts the server with."""
        return PowerSwitch(kill=self.kill, start=self.start)

    async def kill(self) -> None:
        """Run the kill command; RuntimeError if it fails."""
        process = await asyncio.create_subprocess_shell(
            self._kill,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await process.communicate()
        if process.returncode:
            raise RuntimeError(
                f"{self._kill!r} failed ({process.returncode}): {output.decode(errors='replace')}"
            )

    async def start(self) -> None:
        """Launch the start command in its own session (the benchmark waits for the server)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as output:
            self._launched.append(
                subprocess.Popen(  # noqa: ASYNC220, S602 - returns at once; the user's own command
                    self._start,
                    shell=True,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
