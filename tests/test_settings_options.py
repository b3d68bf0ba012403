"""Options become scheduler settings in one place."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from custom_components.llm_lanes.const import (
    OPT_BACKGROUND_PAUSED,
    OPT_BACKGROUND_SHARE,
    OPT_BACKGROUND_WITH_VOICE,
    OPT_HEADROOM,
    OPT_MAX_SEQUENCES,
    OPT_POLICY,
    OPT_PREFILL_GUARD,
    OPT_QUOTA_ACTION,
    OPT_REQUESTER_QUOTAS,
    SETTING_OPTIONS,
)
from custom_components.llm_lanes.core.lanes import DEFAULT_LANE_LIMITS, LANES, Lane
from custom_components.llm_lanes.core.settings import (
    Policy,
    QuotaAction,
    SchedulerSettings,
)
from custom_components.llm_lanes.settings_options import (
    DEFAULT_SLOTS,
    parse_requester_quotas,
    settings_from_options,
)


def test_defaults_follow_the_server_slots() -> None:
    """With no options, settings are the engine's defaults with the server's slot count."""
    settings = settings_from_options({}, 8)
    assert settings.max_sequences == 8
    assert settings.policy is Policy.LANES
    assert settings.lanes == DEFAULT_LANE_LIMITS
    assert settings_from_options({}, None).max_sequences == DEFAULT_SLOTS


def test_options_override_everything() -> None:
    """Each option lands in its setting; lane sections change their lane only."""
    settings = settings_from_options(
        {
            OPT_POLICY: "fifo",
            OPT_MAX_SEQUENCES: 2.0,
            OPT_BACKGROUND_SHARE: 0.25,
            OPT_BACKGROUND_PAUSED: True,
            OPT_QUOTA_ACTION: "reject",
            OPT_REQUESTER_QUOTAS: "user:a=100\nautomation:automation.x = 5",
            "voice": {"ttft_slo_s": 0.3, "max_queued": 4.0},
        },
        8,
    )
    assert settings.policy is Policy.FIFO
    assert settings.max_sequences == 2
    assert settings.background_share == 0.25
    assert settings.background_paused is True
    assert settings.quota_action is QuotaAction.REJECT
    assert settings.requester_quotas == {"user:a": 100, "automation:automation.x": 5}
    assert settings.lanes[Lane.VOICE].ttft_slo_s == 0.3
    assert settings.lanes[Lane.VOICE].max_queued == 4
    assert isinstance(settings.lanes[Lane.VOICE].max_queued, int)
    assert settings.lanes[Lane.BACKGROUND] == DEFAULT_LANE_LIMITS[Lane.BACKGROUND]


def test_headroom_stays_below_max_sequences() -> None:
    """Headroom never takes every slot, so automations can always run."""
    assert (
        settings_from_options({OPT_MAX_SEQUENCES: 2, OPT_HEADROOM: 5}, None).headroom
        == 1
    )
    assert settings_from_options({OPT_MAX_SEQUENCES: 1}, None).headroom == 0


def test_default_output_tokens_capped_by_max() -> None:
    """Lowering a lane's max output tokens lowers its default too."""
    settings = settings_from_options({"voice": {"max_output_tokens": 64}}, None)
    assert settings.lanes[Lane.VOICE].default_output_tokens == 64
    assert settings.lanes[Lane.VOICE].max_output_tokens == 64


@pytest.mark.parametrize("text", ["user:a", "=5", "user:a=x", "user:a=-1"])
def test_bad_quota_lines_raise(text: str) -> None:
    """Malformed quota pairs are refused."""
    with pytest.raises(ValueError):
        parse_requester_quotas(text)


def test_quota_separators() -> None:
    """Pairs may be separated by commas or new lines; blanks are ignored."""
    assert parse_requester_quotas("a=1, b=2\n\n") == {"a": 1, "b": 2}
    assert SchedulerSettings().requester_quotas == {}


def test_background_with_voice_zero_means_no_cap() -> None:
    """The form's 0 is "no limit"; a positive value caps background streams while voice runs."""
    assert (
        settings_from_options({OPT_BACKGROUND_WITH_VOICE: 0}, 4).background_with_voice
        is None
    )
    assert settings_from_options({}, 4).background_with_voice is None
    assert (
        settings_from_options({OPT_BACKGROUND_WITH_VOICE: 1}, 4).background_with_voice
        == 1
    )
    assert (
        settings_from_options({OPT_PREFILL_GUARD: 300}, 4).prefill_guard_tokens == 300
    )


def test_setting_options_name_scheduler_settings() -> None:
    """Each option converted by type alone is named after a scheduler setting (of that type)."""
    base = SchedulerSettings()
    names = {field.name for field in fields(SchedulerSettings)}
    assert set(SETTING_OPTIONS) <= names
    options = {key: getattr(base, key) for key in SETTING_OPTIONS}
    # The server's slot count is what the scheduler places requests on.
    assert settings_from_options(options, base.max_sequences) == replace(
        base, server_slots=base.max_sequences
    )


def test_the_servers_context_caps_every_lane() -> None:
    """Prompt and output limits stop at the server's context per slot; larger ones stay."""
    settings = settings_from_options({"voice": {"max_output_tokens": 4000}}, 4, 2048)
    for lane in LANES:
        limits = settings.lanes[lane]
        assert limits.max_prompt_tokens == 2048
        assert limits.max_output_tokens <= 2048
        assert limits.default_output_tokens <= limits.max_output_tokens
    assert settings.lanes[Lane.VOICE].max_output_tokens == 2048
    roomy = settings_from_options({}, 4, 1_000_000)
    assert roomy.lanes == DEFAULT_LANE_LIMITS
    assert settings_from_options({}, 4, None).lanes == DEFAULT_LANE_LIMITS
    assert settings_from_options({}, 4, 0).lanes == DEFAULT_LANE_LIMITS


def test_default_answers_leave_room_on_a_small_slot() -> None:
    """On 1,024-token slots (llama.cpp's default with --parallel 4) a default answer takes 256.

    A job's reservation is its lane's default answer, so 768 tokens are left for its prompt
    (before, the background lane's 1,024 filled the whole slot and every job was refused).
    """
    settings = settings_from_options({}, 4, 1024)
    for lane in LANES:
        limits = settings.lanes[lane]
        assert limits.default_output_tokens == min(
            256, lane.defaults.default_output_tokens
        )
        assert limits.max_prompt_tokens == 1024
        assert limits.max_output_tokens == 1024
        assert limits.max_prompt_tokens - limits.default_output_tokens >= 768
    # A lane's own lower cap still wins.
    capped = settings_from_options({"voice": {"max_output_tokens": 64}}, 4, 1024)
    assert capped.lanes[Lane.VOICE].default_output_tokens == 64
