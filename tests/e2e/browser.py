"""Steps the browser tests share: screenshots of a walk, onboarding, flow forms, polling."""

from __future__ import annotations

from collections.abc import Callable
from itertools import count
from pathlib import Path
import time
from typing import Any, Protocol

from playwright.sync_api import Page, Response, expect


class Shot(Protocol):
    """Take the walk's next screenshot, named for its step."""

    def __call__(self, name: str, *, full_page: bool = False) -> None:
        """Save ``NN-name.png`` (``full_page``: the whole page, not the viewport)."""


def walk(
    page: Page, folder: Path, steps: Callable[[Shot], None], *, prefix: str = ""
) -> None:
    """Run ``steps`` with a camera that saves ``folder/{prefix}NN-{name}.png``, NN from 01.

    When a step fails, a last screenshot of the whole page (``failed``) shows where.
    """
    shots = count(1)

    def shot(name: str, *, full_page: bool = False) -> None:
        page.screenshot(
            path=folder / f"{prefix}{next(shots):02d}-{name}.png", full_page=full_page
        )

    try:
        steps(shot)
    except Exception:
        shot("failed", full_page=True)
        raise


def fill_owner(page: Page, url: str, owner: dict[str, str]) -> None:
    """Open onboarding and fill in the owner account (``name``, ``username``, ``password``)."""
    page.goto(url)
    page.get_by_role("button", name="Create my smart home").click()
    page.locator("input[name=name]").fill(owner["name"])
    page.locator("input[name=username]").fill(owner["username"])
    page.locator("input[name=password]").fill(owner["password"])
    page.locator("input[name=password_confirm]").fill(owner["password"])


def finish_onboarding(page: Page, owner: dict[str, str]) -> None:
    """Create the filled-in account, pass the analytics and integrations steps; see the welcome."""
    page.get_by_role("button", name="Create account").click()
    page.get_by_role("button", name="Next").click()
    page.get_by_role("button", name="Finish").click()
    expect(page.get_by_text(f"Welcome {owner['name']}")).to_be_visible()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll a condition until it holds (for what no selector can express); return its value."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return result


def is_flow_step(response: Response) -> bool:
    """Tell Home Assistant's answer to a submitted config, options or sub-entry flow step."""
    return response.request.method == "POST" and "/flow/" in response.url


def submit(page: Page) -> dict[str, Any]:
    """Click the open flow form's Submit; return Home Assistant's next step."""
    with page.expect_response(is_flow_step) as answer:
        page.get_by_role("button", name="Submit").click()
    step: dict[str, Any] = answer.value.json()
    return step
