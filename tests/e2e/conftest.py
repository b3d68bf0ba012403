"""A real Home Assistant with the simulated LLM server (as ``scripts/develop`` runs them), a browser.

The browser is Debian's Chromium (``scripts/test`` installs it into the environment); Playwright
drives it and never downloads one. Screenshots go to ``artifacts/e2e/`` at the repository root.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
import re
import shutil
import sys

from playwright.sync_api import Page, sync_playwright
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts/lib"))

from dev_instance import DevInstance, free_port, log_problems  # noqa: E402

SCREENSHOTS = REPO / "artifacts/e2e"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A slow CI machine starts Home Assistant's frontend and its first flows in seconds, not in 30.
TIMEOUT_MS = 60_000
LANGUAGE_CHANGE = re.compile(
    r"WARNING \(MainThread\) \[homeassistant\.helpers\.translation\] Failed to load "
    r"integration for translation: Invalid domain \w+\.\w+$"
)
"""Home Assistant's own warning, once per entity platform loaded (``backup.event``,
``homeassistant.scene``, ours), when the server's language changes while it runs: its
translation cache asks for every loaded component, platforms included. The French step does
that; nothing of ours to fix."""


@pytest.fixture
def home_assistant(tmp_path: Path, socket_enabled: None) -> Iterator[DevInstance]:
    """Home Assistant on a free port, in a fresh config folder, not onboarded, no LLM Lanes entry.

    After it stops, its log must hold no ERROR or WARNING line (but Home Assistant's own
    ``LANGUAGE_CHANGE`` warnings).
    """
    instance = DevInstance(
        tmp_path / "config",
        ha_port=free_port(),
        sim_port=free_port(),
        seed_entry=False,
        quiet=True,
    )
    with instance.running():
        instance.wait_for_http()
        yield instance
    problems = log_problems(instance.log_path.read_text())
    assert [line for line in problems if not LANGUAGE_CHANGE.search(line)] == []


@pytest.fixture
def page(socket_enabled: None) -> Iterator[Page]:
    """Open a Chromium page, 1280x800."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: scripts/test installs it (Debian's chromium)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()


@pytest.fixture
def screenshots() -> Path:
    """Empty artifacts/e2e/ for this run's screenshots."""
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    return SCREENSHOTS
