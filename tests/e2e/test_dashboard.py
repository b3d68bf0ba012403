"""The LLM Lanes dashboard, loaded afresh again and again in a real browser.

The strategy's module is imported beside the frontend's own bundle, in either order. The frontend
looks strategies up in the custom element registry its bundle installs as it starts (a scoped
registry polyfill that replaces ``window.customElements``); an element defined before that lands
in the browser's own registry, where the frontend never finds it ("Timeout waiting for strategy
element ll-strategy-dashboard-llm-lanes to be registered"; the *Add dashboard* card then does
nothing). Each of ``LOADS`` fresh page loads must render the dashboard, half of them with the
frontend's bundle held back until the strategy's module has run (the order that failed one load in
six at random), half with the module held back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
import re
import time

from dev_instance import DevInstance, free_port, log_problems
from playwright.sync_api import Page, Route, expect
import pytest

from tests.e2e import browser
from tests.e2e.conftest import SCREENSHOTS

pytestmark = pytest.mark.e2e

OWNER = {"name": "Dashboard owner", "username": "owner", "password": "twenty-loads"}
LOADS = 20
STRATEGY_ERROR = "Error loading the dashboard strategy"
APP_BUNDLE = re.compile(r"/frontend_latest/app\.[0-9a-f]+\.js$")
STRATEGY_MODULE = re.compile(r"/llm_lanes/dashboard-strategy\.js$")
HELD_S = 1.0
"""How long the held-back script waits: the other one has long run by then."""


def held_back(route: Route) -> None:
    """Let a script through late (the browser fetches and runs the others meanwhile)."""
    time.sleep(HELD_S)
    route.continue_()


@pytest.fixture
def home_assistant(tmp_path: Path, socket_enabled: None) -> Iterator[DevInstance]:
    """Home Assistant with the simulator's entry seeded, not onboarded; its log stays clean."""
    instance = DevInstance(
        tmp_path / "config",
        ha_port=free_port(),
        sim_port=free_port(),
        seed_entry=True,
        quiet=True,
    )
    with instance.running():
        instance.wait_for_http()
        yield instance
    assert log_problems(instance.log_path.read_text()) == []


def outcome(page: Page) -> str:
    """Wait for the dashboard's first tile, or the frontend's strategy error; say which."""
    tiles = page.locator("hui-tile-card")
    error = page.locator("hui-markdown-card", has_text=STRATEGY_ERROR)
    shown: str = browser.wait_for(
        lambda: "rendered" if tiles.count() else "error" if error.count() else "",
        "the dashboard or its error",
    )
    return shown


def test_dashboard_loads_every_time(home_assistant: DevInstance, page: Page) -> None:
    """Add the dashboard from its card, then load it afresh ``LOADS`` times: it always renders."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "dashboard-loads-failed.png"
    shot.unlink(missing_ok=True)
    browser.fill_owner(page, home_assistant.url, OWNER)
    browser.finish_onboarding(page, OWNER)

    # A fresh load of the dashboards page, then the card: it opens the form.
    page.goto(f"{home_assistant.url}/config/lovelace/dashboards")
    page.get_by_role("button", name="Add dashboard").click()
    page.locator("dashboard-card", has_text="LLM Lanes").click()
    page.locator("ha-dialog input[name=title]").fill("LLM Lanes")
    url_path = page.locator("ha-dialog input[name=url_path]")
    expect(url_path).not_to_have_value("")
    path = url_path.input_value()
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("button", name="Create")).to_be_hidden()

    outcomes = []
    for load in range(LOADS):
        late = APP_BUNDLE if load % 2 == 0 else STRATEGY_MODULE
        page.route(late, held_back)
        page.goto(f"{home_assistant.url}/{path}")
        outcomes.append(outcome(page))
        page.unroute(late)
        if outcomes[-1] != "rendered":
            page.screenshot(path=shot, full_page=True)
    assert outcomes == ["rendered"] * LOADS
