"""The suite fails on a deprecated use by llm_lanes, whichever way Home Assistant reports it."""

from __future__ import annotations

import warnings

from homeassistant.core import HomeAssistant
from homeassistant.helpers import frame
from homeassistant.loader import async_get_integration
import pytest

from custom_components.llm_lanes.const import DOMAIN

from .conftest import UsageReports


def test_python_deprecation_warning_from_our_code_is_an_error() -> None:
    """A DeprecationWarning raised in one of our modules, or naming us, fails the test."""
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit(
            "old API",
            DeprecationWarning,
            "chat.py",
            1,
            module="custom_components.llm_lanes.chat",
        )
    with pytest.raises(DeprecationWarning):
        warnings.warn("llm_lanes uses an old API", DeprecationWarning, stacklevel=1)


async def test_frame_report_naming_us_is_collected(
    hass: HomeAssistant, usage_reports: UsageReports
) -> None:
    """Home Assistant's report_usage (a log line, not a warning) is caught for llm_lanes only."""
    await async_get_integration(hass, DOMAIN)
    frame.report_usage(
        "has an update listener and should use it for scheduling a reload",
        core_behavior=frame.ReportBehavior.LOG,
        breaks_in_ha_version="2026.12.0",
        integration_domain=DOMAIN,
    )
    frame.report_usage(
        "does something old",
        core_behavior=frame.ReportBehavior.LOG,
        breaks_in_ha_version="2026.12.0",
        integration_domain="homeassistant",
    )
    assert len(usage_reports.lines) == 1
    assert (
        "custom integration 'llm_lanes' has an update listener"
        in (usage_reports.lines[0])
    )
    usage_reports.lines.clear()  # provoked on purpose
