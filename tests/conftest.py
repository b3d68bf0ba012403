"""Shared fixtures.

Home Assistant's test harness puts its own test config folder (with an empty ``custom_components``)
first on ``sys.path``; importing our package here, at import time, makes sure ours is the one found.
"""

from __future__ import annotations

from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
import pytest

import custom_components.llm_lanes  # noqa: F401


@pytest.fixture(autouse=True)
def auto_enable_custom_integrations(request: pytest.FixtureRequest) -> None:
    """Let Home Assistant load custom integrations in every test that starts one.

    Engine tests (``tests/core``) never touch ``hass``, so they do not pay for starting it.
    """
    if "hass" in request.fixturenames:
        request.getfixturevalue("enable_custom_integrations")


@pytest.fixture
async def ha_core(hass: HomeAssistant) -> HomeAssistant:
    """Home Assistant with its core integration set up (conversation needs exposed entities)."""
    assert await async_setup_component(hass, "homeassistant", {})
    return hass
