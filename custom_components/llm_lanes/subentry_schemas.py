"""Form schemas of the subentry flows: conversation agents, AI Task entities, gateway clients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.const import CONF_NAME
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm
from homeassistant.helpers.selector import (
    BooleanSelector,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TemplateSelector,
)
import probatio

from custom_components.llm_lanes.const import (
    CONF_LANE,
    CONF_LLM_HASS_API,
    CONF_MAX_OUTPUT_TOKENS,
    CONF_MODEL,
    CONF_POOL,
    CONF_PROMPT,
    CONF_QUOTA_TOKENS_PER_DAY,
    CONF_ROTATE_KEY,
    CONF_TEMPERATURE,
    DEFAULT_CLIENT_NAME,
    DEFAULT_TEMPERATURE,
    SUBENTRY_CONVERSATION,
)
from custom_components.llm_lanes.core.lanes import LANES, Lane
from custom_components.llm_lanes.flow_schemas import (
    TOKEN_AMOUNT,
    choice_selector,
    number_selector,
)


def subentry_schema(
    hass: HomeAssistant,
    *,
    subentry_type: str,
    models: tuple[str, ...],
    current: Mapping[str, Any] | None,
    default_model: str,
    default_name: str,
) -> probatio.Schema:
    """Build the form of a conversation agent or AI Task entity (``default_name``: a new one's)."""
    values: Mapping[str, Any] = current or {}
    fields: dict[Any, Any] = {}
    if current is None:
        fields[probatio.Required(CONF_NAME, default=default_name)] = str
    fields[
        probatio.Required(CONF_MODEL, default=values.get(CONF_MODEL, default_model))
    ] = SelectSelector(
        SelectSelectorConfig(
            options=[SelectOptionDict(value=m, label=m) for m in models],
            mode=SelectSelectorMode.DROPDOWN,
            custom_value=True,
            sort=True,
        )
    )
    fields[
        probatio.Optional(
            CONF_PROMPT,
            description={
                "suggested_value": values.get(
                    CONF_PROMPT,
                    llm.DEFAULT_INSTRUCTIONS_PROMPT
                    if subentry_type == SUBENTRY_CONVERSATION
                    else "",
                )
            },
        )
    ] = TemplateSelector()
    if subentry_type == SUBENTRY_CONVERSATION:
        apis = [
            SelectOptionDict(value=api.id, label=api.name)
            for api in llm.async_get_apis(hass)
        ]
        known = {api["value"] for api in apis}
        selected = [api for api in values.get(CONF_LLM_HASS_API, []) if api in known]
        fields[
            probatio.Optional(
                CONF_LLM_HASS_API, description={"suggested_value": selected}
            )
        ] = SelectSelector(SelectSelectorConfig(options=apis, multiple=True))
    fields[
        probatio.Optional(
            CONF_TEMPERATURE,
            description={
                "suggested_value": values.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE)
            },
        )
    ] = number_selector(0, 2, 0.05)
    fields[probatio.Optional(CONF_POOL, default=values.get(CONF_POOL, False))] = (
        BooleanSelector()
    )
    return probatio.Schema(fields)


def client_schema(current: Mapping[str, Any] | None) -> probatio.Schema:
    """Build the form of a gateway client (a new one is named; a known one may get a new key)."""
    values: Mapping[str, Any] = current or {}
    fields: dict[Any, Any] = {}
    if current is None:
        fields[probatio.Required(CONF_NAME, default=DEFAULT_CLIENT_NAME)] = str
    fields[
        probatio.Required(
            CONF_LANE, default=values.get(CONF_LANE, Lane.INTERACTIVE.key)
        )
    ] = choice_selector([lane.key for lane in LANES], "lane")
    for key, selector in (
        (CONF_QUOTA_TOKENS_PER_DAY, TOKEN_AMOUNT),
        (CONF_MAX_OUTPUT_TOKENS, number_selector(1, 131072, 1)),
    ):
        fields[
            probatio.Optional(key, description={"suggested_value": values.get(key)})
        ] = selector
    fields[probatio.Optional(CONF_POOL, default=values.get(CONF_POOL, False))] = (
        BooleanSelector()
    )
    if current is not None:
        fields[probatio.Optional(CONF_ROTATE_KEY, default=False)] = BooleanSelector()
    return probatio.Schema(fields)


def client_data(user_input: Mapping[str, Any]) -> dict[str, Any]:
    """Keep what a client's form says about its lane, limits and pool (whole numbers; 0 is none)."""
    data: dict[str, Any] = {CONF_LANE: user_input[CONF_LANE]}
    for key in (CONF_QUOTA_TOKENS_PER_DAY, CONF_MAX_OUTPUT_TOKENS):
        if value := int(user_input.get(key) or 0):
            data[key] = value
    if user_input.get(CONF_POOL):
        data[CONF_POOL] = True
    return data
