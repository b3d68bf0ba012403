"""The household's pool configured through the flows, in a real browser.

A real Home Assistant (as ``scripts/develop`` starts it) with the simulator's LLM Lanes entry
seeded and a template button, *Wake GPU*, that stands for a Wake-on-LAN button. In the browser:
onboarding, then the server's options: its *Several servers* section (voice as second choice,
never background, the wake button picked with the entity picker, idle minutes with a sleep
entity missing: the error shows, then the sleep entity picked too); then a conversation agent
set to the pool. What was stored is read back from Home Assistant's own storage, and the options
form shows it again. A screenshot of each step goes to ``artifacts/e2e/pool-NN-step.png``.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
import json
from pathlib import Path
import re
from typing import Any

from dev_instance import CONFIG_YAML, DevInstance, free_port, log_problems
from playwright.sync_api import Locator, Page, expect
import pytest

from tests.e2e import browser
from tests.e2e.conftest import SCREENSHOTS

pytestmark = pytest.mark.e2e

OWNER = {"name": "Pool owner", "username": "owner", "password": "several-servers"}
AGENT = "Household agent"
TEMPLATES = """
template:
  - button:
      - name: Wake GPU
        press:
          - delay: 0
  - switch:
      - name: GPU power
        turn_on:
          - delay: 0
        turn_off:
          - delay: 0
"""


@pytest.fixture
def home_assistant(tmp_path: Path, socket_enabled: None) -> Iterator[DevInstance]:
    """Home Assistant with the simulator's entry seeded and the wake/sleep entities, not onboarded."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "configuration.yaml").write_text(CONFIG_YAML.read_text() + TEMPLATES)
    instance = DevInstance(
        config, ha_port=free_port(), sim_port=free_port(), seed_entry=True, quiet=True
    )
    with instance.running():
        instance.wait_for_http()
        yield instance
    assert log_problems(instance.log_path.read_text()) == []


@pytest.fixture
def pool_screenshots() -> Path:
    """Keep this test's screenshots in artifacts/e2e/ (``pool-``), leaving the others'."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("pool-*.png"):
        old.unlink()
    return SCREENSHOTS


def stored_entry(home_assistant: DevInstance) -> dict[str, Any]:
    """Return the LLM Lanes entry as Home Assistant stored it (``.storage``)."""
    path = home_assistant.config_dir / ".storage" / "core.config_entries"
    entries = json.loads(path.read_text())["data"]["entries"]
    (entry,) = [entry for entry in entries if entry["domain"] == "llm_lanes"]
    return dict(entry)


def choose(page: Page, field: Locator, option: str) -> None:
    """Open a dropdown field of the form and pick ``option``."""
    field.click()
    item = page.get_by_text(option, exact=True).filter(visible=True).last
    expect(item).to_be_visible()
    page.wait_for_timeout(300)  # the menu opens with an animation
    item.click()
    expect(field).to_contain_text(option)


def pick_entity(page: Page, picker: Locator, name: str) -> None:
    """Pick an entity in an entity picker by its name."""
    picker.click()
    search = page.locator("ha-picker-combo-box input, ha-combo-box input").last
    search.fill(name)
    page.get_by_text(name, exact=True).filter(visible=True).last.click()


def test_the_pool_options_and_wake_entities(
    home_assistant: DevInstance, page: Page, pool_screenshots: Path
) -> None:
    """Configure the pool of the seeded server and an agent of the pool in the browser."""
    browser.walk(
        page,
        pool_screenshots,
        partial(configure_pool, home_assistant, page),
        prefix="pool-",
    )


def configure_pool(home_assistant: DevInstance, page: Page, shot: browser.Shot) -> None:
    """Walk the steps, one screenshot each."""
    browser.fill_owner(page, home_assistant.url, OWNER)
    browser.finish_onboarding(page, OWNER)

    # The server's options: the Several servers section.
    page.goto(f"{home_assistant.url}/config/integrations/integration/llm_lanes")
    page.get_by_role("button", name="Configure").first.click()
    dialog = page.locator("dialog-data-entry-flow")
    expect(dialog.get_by_text("Scheduler settings")).to_be_visible()
    section = dialog.locator("ha-expansion-panel", has_text="Several servers")
    section.locator(".summary, .header, [slot=header]").first.click()
    expect(section.get_by_text("Voice lane").first).to_be_visible()
    choose(page, section.locator("ha-select", has_text="Voice lane"), "Second choice")
    choose(page, section.locator("ha-select", has_text="Background lane"), "Never")
    pick_entity(page, section.locator("ha-selector-entity").nth(0), "Wake GPU")
    minutes = page.get_by_role("spinbutton", name=re.compile("Sleep after")).filter(
        visible=True
    )
    minutes.first.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("30")
    expect(minutes.first).to_have_value("30")
    shot("pool-section", full_page=True)
    step = browser.submit(page)
    assert step["type"] == "form" and step["errors"] == {
        "base": "idle_sleep_without_entity"
    }
    expect(dialog.locator("ha-alert[alert-type=error]")).to_contain_text(
        "needs a sleep entity"
    )
    shot("needs-sleep-entity", full_page=True)
    assert "pool" not in stored_entry(home_assistant)["options"]

    # The form keeps what was sent; the sleep entity is picked too.
    section.locator(".summary, .header, [slot=header]").first.click()
    expect(section.locator("ha-selector-entity").nth(0)).to_contain_text("Wake GPU")
    pick_entity(page, section.locator("ha-selector-entity").nth(1), "GPU power")
    step = browser.submit(page)
    assert step["type"] == "create_entry", step
    pool = browser.wait_for(
        lambda: stored_entry(home_assistant)["options"].get("pool"),
        "the stored pool options",
    )
    assert pool == {
        "voice_rank": 2,
        "interactive_rank": 1,
        "automation_rank": 1,
        "background_rank": 0,
        "wake_entity": "button.wake_gpu",
        "sleep_entity": "switch.gpu_power",
        "idle_sleep_minutes": 30,
        "wake_limit_s": 180.0,
    }
    shot("pool-stored")
    page.get_by_role("button", name="Finish").click()

    # The form shows what is stored.
    page.get_by_role("button", name="Configure").first.click()
    section = dialog.locator("ha-expansion-panel", has_text="Several servers")
    section.locator(".summary, .header, [slot=header]").first.click()
    expect(section.locator("ha-select", has_text="Voice lane")).to_contain_text(
        "Second choice"
    )
    expect(section.locator("ha-selector-entity").nth(0)).to_contain_text("Wake GPU")
    shot("pool-shown-again", full_page=True)
    page.keyboard.press("Escape")

    # An agent of the pool.
    page.get_by_role("button", name="Add conversation agent").click()
    page.locator("input[name=name]").fill(AGENT)
    page.locator(
        "ha-formfield, ha-selector-boolean", has_text="Use every server"
    ).locator("ha-switch").first.click()
    shot("pool-agent")
    step = browser.submit(page)
    assert step["type"] == "create_entry", step
    agent = browser.wait_for(
        lambda: [
            subentry
            for subentry in stored_entry(home_assistant)["subentries"]
            if subentry["title"] == AGENT
        ],
        "the stored agent",
    )
    assert agent[0]["data"]["pool"] is True
    page.get_by_role("button", name="Finish").click()
    expect(page.get_by_text(AGENT).first).to_be_visible()
    shot("pool-agent-added")
