"""A newcomer's first hour, in a real browser against a real Home Assistant.

Onboarding (the owner account), LLM Lanes added through the UI (a wrong URL first: the error shows
what to check), a conversation agent added as a sub-entry, Assist set to it and a typed command
answered (the simulator answers with random words), the server's device page with the lane
sensors' values and the server's URL, then the LLM Lanes dashboard added from *Add dashboard*
and shown with its cards. Each step leaves a screenshot in artifacts/e2e/.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
import re
import time
from typing import Any

from dev_instance import DevInstance, free_port
from playwright.sync_api import Page, Response, expect
import pytest

pytestmark = pytest.mark.e2e

OWNER = {"name": "Newcomer", "username": "newcomer", "password": "first-hour-password"}
AGENT = "Kitchen helper"
# Text of an element and of every shadow root below it (innerText stops at shadow roots).
DEEP_TEXT = """el => {
  const text = n => (n.shadowRoot ? text(n.shadowRoot) : "")
    + [...n.childNodes].map(c => c.nodeType === Node.TEXT_NODE ? c.textContent : text(c)).join("");
  return text(el).replace(/\\s+/g, " ").trim();
}"""
LANE_SENSOR = re.compile(r"^Interactive requests served [1-9]")
"""The typed chat ran in the interactive lane."""


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll a condition on the page until it holds (for states no selector can express)."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return result


def is_flow_step(response: Response) -> bool:
    """Tell Home Assistant's answer to a submitted config or sub-entry flow step."""
    return response.request.method == "POST" and "/flow/" in response.url


def submit(page: Page) -> dict[str, Any]:
    """Click the open flow form's Submit; return Home Assistant's next step."""
    with page.expect_response(is_flow_step) as answer:
        page.get_by_role("button", name="Submit").click()
    step: dict[str, Any] = answer.value.json()
    return step


def shows_step(page: Page, step_id: str) -> bool:
    """Tell whether the flow dialog has rendered the given step."""
    shown: str | None = page.locator("step-flow-form").evaluate("e => e.step?.step_id")
    return shown == step_id


def submit_until_created(page: Page, step: dict[str, Any]) -> None:
    """Submit each further form with its defaults until the flow creates its entry."""
    while step["type"] == "form":
        assert not step.get("errors"), step
        step_id = step["step_id"]
        wait_for(partial(shows_step, page, step_id), f"the form of step {step_id}")
        step = submit(page)
    assert step["type"] == "create_entry", step


def test_first_hour(home_assistant: DevInstance, page: Page, screenshots: Path) -> None:
    """Onboard, add the server and an agent, ask Assist, read the device page."""
    shots = iter(range(1, 100))

    def shot(name: str, *, full_page: bool = False) -> None:
        page.screenshot(
            path=screenshots / f"{next(shots):02d}-{name}.png", full_page=full_page
        )

    try:
        first_hour(home_assistant, page, shot)
    except Exception:
        shot("failed", full_page=True)
        raise


def first_hour(
    home_assistant: DevInstance, page: Page, shot: Callable[..., None]
) -> None:
    """Walk the steps, one screenshot each."""

    # Onboarding: the owner account, then the analytics and integrations steps.
    page.goto(home_assistant.url)
    page.get_by_role("button", name="Create my smart home").click()
    page.locator("input[name=name]").fill(OWNER["name"])
    page.locator("input[name=username]").fill(OWNER["username"])
    page.locator("input[name=password]").fill(OWNER["password"])
    page.locator("input[name=password_confirm]").fill(OWNER["password"])
    shot("owner")
    page.get_by_role("button", name="Create account").click()
    page.get_by_role("button", name="Next").click()
    page.get_by_role("button", name="Finish").click()
    expect(page.get_by_text(f"Welcome {OWNER['name']}")).to_be_visible()
    shot("onboarded")

    # Add LLM Lanes: a URL nothing answers on first, then the simulator.
    page.goto(f"{home_assistant.url}/config/integrations/dashboard")
    page.get_by_role("button", name="Add integration").click()
    page.get_by_placeholder("Search for a brand name").fill("LLM Lanes")
    page.locator("ha-integration-list-item", has_text="LLM Lanes").click()
    page.locator("input[name=url]").fill(f"http://127.0.0.1:{free_port()}")
    step = submit(page)
    assert step["type"] == "form"
    assert step["errors"]
    error = page.locator("ha-alert[alert-type=error]")
    expect(error).to_be_visible()
    # The error names the URL tried and what to check there.
    assert "127.0.0.1" in error.evaluate(DEEP_TEXT)
    shot("wrong-url-error")
    page.locator("input[name=url]").fill(home_assistant.sim_url)
    submit_until_created(page, submit(page))
    done = page.get_by_role("button", name=re.compile(r"^(Skip and finish|Finish)$"))
    shot("server-added")
    done.click()

    # A conversation agent of our own, as a sub-entry of the server.
    page.goto(f"{home_assistant.url}/config/integrations/integration/llm_lanes")
    page.get_by_role("button", name="Add conversation agent").click()
    page.locator("input[name=name]").fill(AGENT)
    submit_until_created(page, submit(page))
    shot("agent-added")
    page.get_by_role("button", name="Finish").click()
    expect(page.get_by_text(AGENT).first).to_be_visible()

    # Assist uses it: Settings → Voice assistants → the default assistant's conversation agent.
    page.goto(f"{home_assistant.url}/config/voice-assistants/assistants")
    page.locator("assist-pref ha-list-item-button", has_text="Home Assistant").click()
    page.locator("ha-conversation-agent-picker").click()
    page.get_by_text(AGENT).last.click()
    expect(page.locator("ha-conversation-agent-picker")).to_contain_text(AGENT)
    shot("assist-agent")
    page.get_by_role("button", name="Update").click()
    expect(page.get_by_role("button", name="Update")).to_be_hidden()

    # A typed command: any answer counts (the simulator answers with random words).
    page.goto(f"{home_assistant.url}/home/overview")
    page.get_by_role("button", name="Assist (A)").click()
    request = page.locator("ha-assist-chat input").first
    request.fill("What is on in the kitchen?")
    request.press("Enter")
    answers = page.locator("ha-assist-chat .message.hass")
    expect(answers).to_have_count(2)  # the greeting, then the answer
    # While the answer streams, the frontend ends it with an ellipsis.
    wait_for(
        lambda: (text := answers.nth(1).evaluate(DEEP_TEXT)) and not text.endswith("…"),
        "the whole answer",
    )
    shot("assist-answer")
    page.keyboard.press("Escape")

    # The server's device page: a lane sensor counts the chat. Its
    # title carries the host; its agents' titles too ("llama.cpp on 127.0.0.1 conversation").
    page.goto(f"{home_assistant.url}/config/integrations/integration/llm_lanes")
    page.locator(
        "ha-list-item-button", has_text=re.compile(r"llama\.cpp on 127\.0\.0\.1 \(")
    ).click()
    rows = page.locator("ha-device-entities-card hui-generic-entity-row")
    expect(rows.first).to_be_visible()
    lane_values = wait_for(
        lambda: [
            text
            for text in (row.evaluate(DEEP_TEXT) for row in rows.all())
            if LANE_SENSOR.match(text)
        ],
        "a lane sensor with a value",
    )
    shot("device-page", full_page=True)
    assert lane_values
    # The server's URL: the device's Visit link and its Server URL sensor.
    expect(page.locator(f'a[href="{home_assistant.sim_url}"]').first).to_be_attached()
    wait_for(
        lambda: any(
            row.evaluate(DEEP_TEXT).startswith("Server URL")
            and home_assistant.sim_url in row.evaluate(DEEP_TEXT)
            for row in rows.all()
        ),
        "the Server URL sensor",
    )

    # The LLM Lanes dashboard, offered by the integration in Add dashboard.
    page.goto(f"{home_assistant.url}/config/lovelace/dashboards")
    page.get_by_role("button", name="Add dashboard").click()
    page.locator("dashboard-card", has_text="LLM Lanes").click()
    page.locator("ha-dialog input[name=title]").fill("LLM Lanes")
    url_path = page.locator("ha-dialog input[name=url_path]")
    expect(url_path).not_to_have_value("")
    path = url_path.input_value()
    shot("dashboard-add")
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("button", name="Create")).to_be_hidden()
    page.goto(f"{home_assistant.url}/{path}")
    expect(page.locator("hui-history-graph-card").first).to_be_visible()
    expect(page.locator("hui-tile-card").first).to_be_visible()
    assert page.locator("hui-error-card").count() == 0
    shot("dashboard", full_page=True)
