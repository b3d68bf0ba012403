"""The simulated LLM server and a real Home Assistant with LLM Lanes, as ``scripts/develop`` runs them.

    python scripts/lib/dev_instance.py [--config DIR] [--ha-port 8123]
        [--sim-port 11434] [--sim-slots 4] [--sim-speed 1]   the simulator and its entry (default)
        | --server URL [--api-key KEY]                        an entry for your server, no simulator
        | --empty                                            no simulator, no entry: add one in the UI
    python scripts/lib/dev_instance.py --check

The first form serves the config folder (``config/`` in the repository unless ``--config``) until
Ctrl-C. ``--check`` starts the same thing in a fresh config
folder on free ports, then checks it as a newcomer would find it: an owner is created through the
onboarding API, Home Assistant's REST API must show the LLM Lanes entry loaded, its entities with
states, its conversation agent answering and ``llm_lanes.summarize`` summarizing the recorder's
history of two of its sensors; after the stop, the log must hold no ERROR or WARNING line. ``tests/e2e`` starts its Home Assistant with the same class.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
import ctypes
from dataclasses import dataclass, field
import json
import os
from pathlib import Path
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any
import urllib.error
import urllib.request

from homeassistant.components import automation as automation_component
import seed_config

REPO = Path(__file__).resolve().parents[2]
CONFIG_YAML = REPO / "config" / "configuration.yaml"
LOG_LEVEL = re.compile(r"^\S+ \S+ (?P<level>ERROR|WARNING|CRITICAL) ")
# Home Assistant's loader warns about every custom integration at every start; nothing to fix.
EXPECTED = re.compile(
    r"WARNING \(\w+\) \[homeassistant\.loader\] We found a custom integration llm_lanes "
    r"which has not been tested by Home Assistant\."
)
UI_FILES = {"automations.yaml": "[]\n", "scripts.yaml": "", "scenes.yaml": ""}
"""What the UI writes to (automations, scripts, scenes), created empty as Home Assistant does."""
CHECK_USER = {"name": "Check", "username": "check", "password": "check-password"}


def free_port() -> int:
    """Return a TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_problems(log: str) -> list[str]:
    """Return the ERROR, WARNING and CRITICAL lines of a Home Assistant log, less EXPECTED."""
    return [
        line
        for line in log.splitlines()
        if LOG_LEVEL.match(line) and not EXPECTED.search(line)
    ]


@dataclass
class DevInstance:
    """A config folder, the simulator and Home Assistant serving that folder."""

    config_dir: Path
    ha_port: int = 8123
    sim_port: int = 11434
    sim_slots: int = 4
    sim_speed: float = 1.0
    # False leaves the LLM Lanes entry to be added through the UI (tests/e2e).
    seed_entry: bool = True
    with_simulator: bool = True
    """Whether the simulator runs (for the UI to add, with ``seed_entry`` False); never beside ``server``."""
    server: str | None = None
    """The LLM server the entry is for (none: the simulator, started with Home Assistant)."""
    api_key: str | None = None
    """The API key of ``server``, when it asks for one."""
    quiet: bool = False
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Home Assistant's base URL."""
        return f"http://{seed_config.HTTP_HOST}:{self.ha_port}"

    @property
    def sim_url(self) -> str:
        """The simulator's base URL."""
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def simulated(self) -> bool:
        """Whether the simulator runs: unless the entry is for another server, or it is not wanted."""
        return self.server is None and self.with_simulator

    @property
    def entry_url(self) -> str | None:
        """The URL the seeded LLM Lanes entry is for (None: no entry is seeded)."""
        if not self.seed_entry:
            return None
        return self.server if self.server is not None else self.sim_url

    @property
    def log_path(self) -> Path:
        """Home Assistant's log file."""
        return self.config_dir / "home-assistant.log"

    @property
    def hass(self) -> subprocess.Popen[bytes]:
        """The Home Assistant process (started last)."""
        return self._processes[-1]

    def prepare(self) -> None:
        """Fill the config folder with what Home Assistant and LLM Lanes need to start.

        configuration.yaml (unless the folder has one), the files it includes, a link to the
        repository's integration and a copy of its blueprints.
        """
        self.config_dir.mkdir(parents=True, exist_ok=True)
        if not (self.config_dir / "configuration.yaml").exists():
            shutil.copy(CONFIG_YAML, self.config_dir / "configuration.yaml")
        # What configuration.yaml includes, as Home Assistant's default configuration starts them.
        for name, empty in UI_FILES.items():
            if not (self.config_dir / name).exists():
                (self.config_dir / name).write_text(empty)
        link = self.config_dir / "custom_components" / "llm_lanes"
        link.parent.mkdir(exist_ok=True)
        ours = REPO / "custom_components" / "llm_lanes"
        if link.exists() and not link.is_symlink():
            raise SystemExit(
                f"{link} is an installed copy of LLM Lanes, not this checkout's: move it "
                "away, or use another folder (--config)"
            )
        if link.is_symlink() and link.resolve() != ours:  # another checkout's
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(ours)
        # The blueprints, copied at each start where Settings → Blueprints finds them (Home
        # Assistant does not follow a linked folder there). Home Assistant adds its own examples
        # only to a folder it creates: they are copied first, as it would.
        automation_blueprints = self.config_dir / "blueprints" / "automation"
        if not automation_blueprints.exists():
            shutil.copytree(
                Path(automation_component.__file__).parent / "blueprints",
                automation_blueprints / "homeassistant",
            )
        blueprints = automation_blueprints / "llm_lanes"
        if blueprints.is_symlink():  # an older develop linked them
            blueprints.unlink()
        shutil.copytree(
            REPO / "blueprints" / "automation" / "llm_lanes",
            blueprints,
            dirs_exist_ok=True,
        )

    def start(self) -> None:
        """Prepare the folder, start the simulator, seed the storage, start Home Assistant."""
        self.prepare()

        if self.simulated:
            say(f"simulated LLM server on {self.sim_url} ({self.sim_slots} slots)")
            with (self.config_dir / "simulator.log").open("wb") as sim_log:
                self._spawn(
                    "tools.simulator",
                    *("--port", str(self.sim_port), "--slots", str(self.sim_slots)),
                    *("--speed", str(self.sim_speed)),
                    stdout=sim_log,
                )
            wait_until(
                lambda: http_status(f"{self.sim_url}/health") == 200,
                self._processes[0],
                "the simulator",
            )

        entry = (
            f" and the LLM Lanes entry for {self.entry_url}" if self.entry_url else ""
        )
        say(f"HTTP server, onboarding{entry} in .storage ({self.config_dir})")
        seed_config.run(self.config_dir, self.ha_port, self.entry_url, self.api_key)

        say(f"Home Assistant on {self.url} (log: {self.log_path})")
        self._spawn(
            "homeassistant",
            *("--config", str(self.config_dir)),
            stdout=subprocess.DEVNULL if self.quiet else None,
        )

    def wait_for_http(self, timeout: float = 300) -> None:
        """Wait until Home Assistant answers HTTP (its onboarding API needs no login)."""
        wait_until(
            lambda: http_status(f"{self.url}/api/onboarding") == 200,
            self.hass,
            "Home Assistant",
            timeout,
        )

    def stop(self) -> None:
        """Stop Home Assistant, then the simulator (SIGTERM, then SIGKILL after a minute)."""
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self._processes.clear()

    def _spawn(self, module: str, *args: str, stdout: Any) -> None:
        self._processes.append(
            subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=REPO,
                stdout=stdout,
                stderr=subprocess.STDOUT if stdout is not None else None,
            )
        )

    @contextmanager
    def running(self) -> Iterator[DevInstance]:
        """Start on entry, stop on exit."""
        try:
            self.start()
            yield self
        finally:
            self.stop()


def say(message: str) -> None:
    """Print a step the way the shell scripts do."""
    print(f"\033[1m==> {message}\033[0m", file=sys.stderr, flush=True)


def http_status(url: str) -> int | None:
    """Return the HTTP status of a GET, None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def wait_until(
    ready: Any, process: subprocess.Popen[bytes], what: str, timeout: float = 60
) -> None:
    """Poll ready() until it is true; fail when the process ends or the time is up."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not answer within {timeout:.0f} s")
        time.sleep(0.5)


class Api:
    """Home Assistant's REST API as an owner made through onboarding."""

    def __init__(self, url: str) -> None:
        """Create the owner account (onboarding's first step) and log in."""
        self.url = url
        self.headers = {"Content-Type": "application/json"}
        client_id = f"{url}/"
        code = self.post(
            "/api/onboarding/users",
            {**CHECK_USER, "client_id": client_id, "language": "en"},
        )["auth_code"]
        form = f"grant_type=authorization_code&code={code}&client_id={client_id}"
        request = urllib.request.Request(f"{url}/auth/token", data=form.encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            self.headers["Authorization"] = (
                f"Bearer {json.load(response)['access_token']}"
            )

    def get(self, path: str) -> Any:
        """GET a JSON answer."""
        return self.post(path, None)

    def post(self, path: str, body: dict[str, Any] | None) -> Any:
        """POST JSON (GET without a body), return the JSON answer."""
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers=self.headers,
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)


def check_running(instance: DevInstance) -> None:
    """Fail unless the LLM Lanes entry is loaded, has entities, its agent answers, summaries run."""
    instance.wait_for_http()
    api = Api(instance.url)
    wait_until(
        lambda: api.get("/api/config")["state"] == "RUNNING",
        instance.hass,
        "Home Assistant's start",
        300,
    )
    entries = api.get("/api/config/config_entries/entry?domain=llm_lanes")
    states = {entry["title"]: entry["state"] for entry in entries}
    say(f"LLM Lanes entries: {states}")
    if list(states.values()) != ["loaded"]:
        raise SystemExit(f"expected one loaded LLM Lanes entry, found {states}")
    ids = api.post(
        "/api/template",
        {"template": "{{ integration_entities('llm_lanes') | to_json }}"},
    )
    entities = {
        state["entity_id"]: state["state"]
        for state in api.get("/api/states")
        if state["entity_id"] in ids
    }
    say(f"{len(entities)} LLM Lanes entities, e.g. {dict(list(entities.items())[:4])}")
    if unavailable := [
        eid for eid, state in entities.items() if state == "unavailable"
    ]:
        raise SystemExit(f"unavailable entities: {unavailable}")
    agents = [eid for eid in entities if eid.startswith("conversation.")]
    if not agents:
        raise SystemExit("no LLM Lanes conversation agent")
    answer = api.post(
        "/api/conversation/process", {"text": "hello", "agent_id": agents[0]}
    )
    speech = answer["response"]["speech"]["plain"]["speech"]
    say(f"{agents[0]} answered {speech[:60]!r}")
    if answer["response"]["response_type"] == "error" or not speech:
        raise SystemExit(f"the agent did not answer: {answer}")
    # The recorder's history of two sensors, summarized now (the nightly job path).
    sensors = [eid for eid in entities if eid.startswith("sensor.")][:2]
    summary = api.post(
        "/api/services/llm_lanes/summarize?return_response",
        {"entity_ids": sensors, "look_back": "01:00:00", "run_now": True, "wait": True},
    )["service_response"]
    say(f"summary of {sensors}: {summary['status']}, {summary['output_tokens']} tokens")
    if summary["status"] != "done" or not summary["text"]:
        raise SystemExit(f"the summary of {sensors} did not run: {summary}")


def check() -> int:
    """Start develop's Home Assistant in a fresh folder, check it, stop it, read its log."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llm_lanes-check-") as folder:
        instance = DevInstance(
            Path(folder), ha_port=free_port(), sim_port=free_port(), quiet=True
        )
        try:
            with instance.running():
                check_running(instance)
        except BaseException:
            if instance.log_path.exists():
                tail = instance.log_path.read_text().splitlines()[-40:]
                print(
                    "\n".join(["home-assistant.log ends with:", *tail]), file=sys.stderr
                )
            raise
        log = instance.log_path.read_text()
    if problems := log_problems(log):
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(f"{len(problems)} ERROR/WARNING lines in home-assistant.log")
    say(f"develop check passed in {time.monotonic() - started:.0f} s, clean log")
    return 0


PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_on_signals() -> None:
    """Stop as on Ctrl-C on SIGTERM and SIGHUP too (once), and when ``scripts/develop`` itself is killed.

    Without it a ``kill`` of the script or a closed terminal leaves Home Assistant and the
    simulator running on their ports, and the next start fails.
    """

    def stop(signum: int, frame: object) -> None:
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise KeyboardInterrupt

    # SIGINT too: started in the background by a shell, the script inherits an ignored SIGINT.
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    if sys.platform == "linux":
        # The kernel sends SIGTERM when the parent (the script's shell) goes.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == 1:
            raise KeyboardInterrupt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read ``scripts/develop``'s options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="start the simulator's set-up in a fresh folder, check it, stop",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=REPO / "config",
        help="the configuration folder (made if missing; default: config/ in the repository)",
    )
    parser.add_argument("--ha-port", type=int, default=8123)
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--server",
        metavar="URL",
        help="add the LLM Lanes entry for this LLM server instead of the simulator's "
        "(no simulator)",
    )
    target.add_argument(
        "--empty",
        action="store_true",
        help="no simulator and no LLM Lanes entry: add your server in the UI",
    )
    parser.add_argument("--api-key", help="the API key of --server, if it asks for one")
    parser.add_argument("--sim-port", type=int, default=11434)
    parser.add_argument("--sim-slots", type=int, default=4)
    parser.add_argument("--sim-speed", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.api_key and not args.server:
        parser.error("--api-key goes with --server")
    return args


def instance_from_args(args: argparse.Namespace) -> DevInstance:
    """Return the Home Assistant (and simulator) the options ask for."""
    return DevInstance(
        args.config.expanduser().resolve(),
        ha_port=args.ha_port,
        sim_port=args.sim_port,
        sim_slots=args.sim_slots,
        sim_speed=args.sim_speed,
        seed_entry=not args.empty,
        with_simulator=not args.empty,
        server=args.server,
        api_key=args.api_key,
    )


def main() -> int:
    """Serve the config folder until Ctrl-C (or SIGTERM, SIGHUP), or run the check."""
    args = parse_args()
    if args.check:
        return check()
    instance = instance_from_args(args)
    with suppress(KeyboardInterrupt):
        stop_on_signals()
        with instance.running():
            return instance.hass.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
