"""A newcomer's first hour, and the first evening, in a real browser against a real Home Assistant.

Onboarding (the owner account), LLM Lanes added through the UI (a wrong URL first: the error shows
what to check), a conversation agent added as a sub-entry, Assist set to it and a typed command
answered (the simulator answers with random words); a gateway client added, its key dialog closed
with its X (the client stays) and the URL and key it showed used by the real ``openai`` client;
the server's device page with the lane sensors' values and the server's URL; an automation made
from the *LLM slow → pause background* blueprint (its switch picker offers *Background paused*
alone) and listed; the LLM Lanes dashboard added from *Add dashboard*, its latency graph showing
the requests' lane with data; then a French user's device page, with the server's language English
(names are the server's, by design), then French. Each step leaves a screenshot in
artifacts/e2e/.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
import re
from typing import Any

from dev_instance import DevInstance, free_port
import openai
from playwright.sync_api import Page, expect
import pytest

from tests.e2e import browser

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
CLIENT = "Phone app"
CLIENT_REQUESTS = 3
"""Chats the client sends (interactive, its lane): the dashboard's graphs have data then."""
BLUEPRINT = "LLM slow → pause background"
HOME_ASSISTANT = "document.querySelector('home-assistant')"


def shows_step(page: Page, step_id: str) -> bool:
    """Tell whether the flow dialog has rendered the given step."""
    shown: str | None = page.locator("step-flow-form").evaluate("e => e.step?.step_id")
    return shown == step_id


def submit_until_created(page: Page, step: dict[str, Any]) -> None:
    """Submit each further form with its defaults until the flow creates its entry."""
    while step["type"] == "form":
        assert not step.get("errors"), step
        step_id = step["step_id"]
        browser.wait_for(
            partial(shows_step, page, step_id), f"the form of step {step_id}"
        )
        step = browser.submit(page)
    assert step["type"] == "create_entry", step


def test_first_hour(home_assistant: DevInstance, page: Page, screenshots: Path) -> None:
    """Onboard, add the server and an agent, ask Assist, read the device page."""
    browser.walk(page, screenshots, partial(first_hour, home_assistant, page))


def first_hour(home_assistant: DevInstance, page: Page, shot: browser.Shot) -> None:
    """Walk the steps, one screenshot each."""

    # Onboarding: the owner account, then the analytics and integrations steps.
    browser.fill_owner(page, home_assistant.url, OWNER)
    shot("owner")
    browser.finish_onboarding(page, OWNER)
    shot("onboarded")

    # Add LLM Lanes: a URL nothing answers on first, then the simulator.
    page.goto(f"{home_assistant.url}/config/integrations/dashboard")
    page.get_by_role("button", name="Add integration").click()
    page.get_by_placeholder("Search for a brand name").fill("LLM Lanes")
    page.locator("ha-integration-list-item", has_text="LLM Lanes").click()
    page.locator("input[name=url]").fill(f"http://127.0.0.1:{free_port()}")
    step = browser.submit(page)
    assert step["type"] == "form"
    assert step["errors"]
    error = page.locator("ha-alert[alert-type=error]")
    expect(error).to_be_visible()
    # The error names the URL tried and what to check there.
    assert "127.0.0.1" in error.evaluate(DEEP_TEXT)
    shot("wrong-url-error")
    page.locator("input[name=url]").fill(home_assistant.sim_url)
    submit_until_created(page, browser.submit(page))
    done = page.get_by_role("button", name=re.compile(r"^(Skip and finish|Finish)$"))
    shot("server-added")
    done.click()

    # A conversation agent of our own, as a sub-entry of the server.
    page.goto(f"{home_assistant.url}/config/integrations/integration/llm_lanes")
    page.get_by_role("button", name="Add conversation agent").click()
    page.locator("input[name=name]").fill(AGENT)
    submit_until_created(page, browser.submit(page))
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
    browser.wait_for(
        lambda: (text := answers.nth(1).evaluate(DEEP_TEXT)) and not text.endswith("…"),
        "the whole answer",
    )
    shot("assist-answer")
    page.keyboard.press("Escape")

    client_url, client_key = add_client(home_assistant, page, shot)
    ask_through_the_gateway(client_url, client_key)

    # The server's device page: a lane sensor counts the chat and the client's requests. Its
    # title carries the host.
    open_device_page(home_assistant, page)
    rows = page.locator("ha-device-entities-card hui-generic-entity-row")
    lane_values = browser.wait_for(
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
    browser.wait_for(
        lambda: any(
            row.evaluate(DEEP_TEXT).startswith("Server URL")
            and home_assistant.sim_url in row.evaluate(DEEP_TEXT)
            for row in rows.all()
        ),
        "the Server URL sensor",
    )

    automation_from_blueprint(home_assistant, page, shot)
    dashboard(home_assistant, page, shot)
    french_device_page(home_assistant, page, shot)


def open_device_page(home_assistant: DevInstance, page: Page) -> None:
    """Open the server's device page from the integration's page; wait for its entities."""
    page.goto(f"{home_assistant.url}/config/integrations/integration/llm_lanes")
    page.locator(
        "ha-list-item-button", has_text=re.compile(r"llama\.cpp on 127\.0\.0\.1 \(")
    ).click()
    expect(
        page.locator("ha-device-entities-card hui-generic-entity-row").first
    ).to_be_visible()


def add_client(
    home_assistant: DevInstance, page: Page, shot: Callable[..., None]
) -> tuple[str, str]:
    """Add a gateway client; return the OpenAI base URL and the key its dialog shows.

    The dialog is closed with its X: the client was stored when the form was submitted.
    """
    page.goto(f"{home_assistant.url}/config/integrations/integration/llm_lanes")
    page.get_by_role("button", name="Add client").first.click()
    page.locator("input[name=name]").fill(CLIENT)
    step = browser.submit(page)
    assert step["type"] == "create_entry", step
    blocks = page.locator("step-flow-create-entry pre code")
    expect(blocks).to_have_count(3)  # the key, the OpenAI base URL, the Ollama host URL
    key, openai_url, ollama_url = (block.inner_text().strip() for block in blocks.all())
    # Where Home Assistant listens (127.0.0.1 here), not a LAN address it detected.
    assert openai_url == f"{home_assistant.url}/api/llm_lanes/v1"
    assert ollama_url == f"{home_assistant.url}/api/llm_lanes/ollama/{key}"
    dialog = page.locator("step-flow-create-entry")
    assert f"Authorization: Bearer {key}" in dialog.evaluate(DEEP_TEXT)
    shot("client-key")
    page.locator("dialog-data-entry-flow").get_by_role("button", name="Close").click()
    expect(page.locator("step-flow-create-entry")).to_have_count(0)
    # Kept, whether the dialog was closed with its X or its Finish button.
    page.reload()
    expect(page.get_by_text(CLIENT).first).to_be_visible()
    return openai_url, key


def ask_through_the_gateway(base_url: str, api_key: str) -> None:
    """Chat through the gateway with the real ``openai`` client and what the dialog showed."""
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        (model,) = [model.id for model in client.models.list()]
        for _ in range(CLIENT_REQUESTS):
            answer = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Is the kitchen light on?"}],
                max_tokens=8,
            )
            assert answer.choices[0].message.content


def pick_entity(page: Page, picker: Any, search: str | None = None) -> list[str]:
    """Open an entity picker; return what it offers (after ``search``) and pick the first."""
    picker.click()
    if search is not None:
        page.locator("ha-picker-combo-box input").last.fill(search)
    options = page.locator("ha-picker-combo-box ha-combo-box-item")
    expect(options.first).to_be_visible()
    if search is not None:
        expect(options).to_have_count(1)
    offered: list[str] = [option.evaluate(DEEP_TEXT) for option in options.all()]
    options.first.click()
    return offered


def automation_from_blueprint(
    home_assistant: DevInstance, page: Page, shot: Callable[..., None]
) -> None:
    """Make an automation from the blueprint in the UI; it is listed, and kept in its file."""
    page.goto(f"{home_assistant.url}/config/blueprint/dashboard")
    page.get_by_text(BLUEPRINT).first.click()
    pickers = page.locator("ha-entity-picker")
    expect(pickers).to_have_count(2)  # the latency sensor, the Background paused switch
    switches = pick_entity(page, pickers.nth(1))
    assert [option.split(" llama.cpp")[0] for option in switches] == [
        "Background paused"
    ]
    pick_entity(page, pickers.nth(0), "Interactive time to first token p95")
    shot("blueprint-automation")
    page.get_by_role("button", name="Save").click()
    automations = home_assistant.config_dir / "automations.yaml"
    browser.wait_for(
        lambda: "llm_lanes/llm_slow_pause_background.yaml" in automations.read_text(),
        "the automation in automations.yaml",
    )
    page.goto(f"{home_assistant.url}/config/automation/dashboard")
    expect(page.locator("ha-data-table").get_by_text(BLUEPRINT)).to_be_visible()
    shot("automations")


def dashboard(
    home_assistant: DevInstance, page: Page, shot: Callable[..., None]
) -> None:
    """Add the LLM Lanes dashboard; its cards show, its latency graph the lane with data."""
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
    # The chats ran in the interactive lane: its time to first token is graphed, with a value
    # (voice, which served nothing, is left out), and the graph has its history.
    ttft = page.locator("hui-history-graph-card", has_text="Time to first token p95")
    expect(ttft.locator("ha-chart-base canvas")).to_be_visible()
    legend = browser.wait_for(
        lambda: (
            (text := ttft.evaluate(DEEP_TEXT)) and re.search(r"\d+ ms", text) and text
        ),
        "a time to first token in the graph",
    )
    assert "Interactive time to first token p95" in legend
    assert "Voice" not in legend
    assert "No state history found" not in legend
    shot("dashboard", full_page=True)


def french_device_page(
    home_assistant: DevInstance, page: Page, shot: Callable[..., None]
) -> None:
    """Show a French user the device page: French around, names in the server's language.

    Home Assistant names entities in the server's language (*Settings → System → General*),
    whatever the user's: with the server in English they stay English; once it is French (and
    the entry reloaded, as after a restart), they are French, the agents' too.
    """
    page.evaluate(
        f"() => {HOME_ASSISTANT}.dispatchEvent(new CustomEvent('hass-language-select',"
        " {detail: 'fr', bubbles: true, composed: true}))"
    )
    page.goto(f"{home_assistant.url}/config/integrations/integration/llm_lanes")
    # Our translations in the user's language: the sub-entry buttons.
    expect(page.get_by_role("button", name="Ajouter un client").first).to_be_visible()
    open_device_page(home_assistant, page)
    rows = page.locator("ha-device-entities-card hui-generic-entity-row")
    browser.wait_for(
        lambda: any(LANE_SENSOR.match(row.evaluate(DEEP_TEXT)) for row in rows.all()),
        "the server's English names",
    )
    shot("device-page-french-user", full_page=True)

    page.evaluate(
        f"""async () => {{
          const hass = {HOME_ASSISTANT}.hass;
          await hass.callWS({{type: "config/core/update", language: "fr"}});
          const [entry] = await hass.callWS({{type: "config_entries/get", domain: "llm_lanes"}});
          await hass.callApi("POST", `config/config_entries/entry/${{entry.entry_id}}/reload`);
        }}"""
    )
    open_device_page(home_assistant, page)
    rows = page.locator("ha-device-entities-card hui-generic-entity-row")
    browser.wait_for(
        lambda: any(
            re.match(
                r"^Requêtes servies \(Interactive\) [1-9]", row.evaluate(DEEP_TEXT)
            )
            for row in rows.all()
        ),
        "the French names",
    )
    names = page.evaluate(
        f"""() => Object.values({HOME_ASSISTANT}.hass.states)
          .filter(s => s.entity_id.startsWith("ai_task."))
          .map(s => s.attributes.friendly_name)"""
    )
    assert names == ["llama.cpp on 127.0.0.1 Tâche IA"], names
    shot("device-page-french", full_page=True)
