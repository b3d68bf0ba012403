"""Who is charged for a request: requester ids, and the names their token sensors show.

``user:<ha user id>``, ``device:<device id>`` (a voice satellite), ``automation:<entity id>``,
``ai_task`` (an AI Task call from an unknown automation), ``job:<job name>``,
``client:<subentry id>`` (an app using the gateway with its client key), else free text.
"""

from __future__ import annotations

from typing import Final

from homeassistant.const import ATTR_FRIENDLY_NAME
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import device_registry as dr, entity_registry as er

from .const import DOMAIN

AI_TASK_REQUESTER: Final = "ai_task"
AUTOMATION_DOMAIN: Final = "automation"


def user_requester(user_id: str) -> str:
    """Name the requester of a Home Assistant user."""
    return f"user:{user_id}"


def device_requester(device_id: str) -> str:
    """Name the requester of a device (a voice satellite)."""
    return f"device:{device_id}"


def automation_requester(entity_id: str) -> str:
    """Name the requester of an automation."""
    return f"automation:{entity_id}"


def job_requester(name: str) -> str:
    """Name the requester of a stored job."""
    return f"job:{name}"


def client_requester(subentry_id: str) -> str:
    """Name the requester of a gateway client (its subentry)."""
    return f"client:{subentry_id}"


def automation_for_context(hass: HomeAssistant, context: Context | None) -> str | None:
    """Find the automation whose run created ``context`` (or its parent), if any.

    An automation writes its state with the context of the run it starts, and every action of
    that run carries the same context (or a child of it).
    """
    if context is None:
        return None
    ids = {context.id, context.parent_id} - {None}
    for state in hass.states.async_all(AUTOMATION_DOMAIN):
        if state.context.id in ids:
            return state.entity_id
    return None


def requester_for_context(
    hass: HomeAssistant, context: Context | None, default: str
) -> str:
    """Charge the user who asked, else the automation that ran, else ``default``."""
    if context is not None and context.user_id:
        return user_requester(context.user_id)
    if (automation := automation_for_context(hass, context)) is not None:
        return automation_requester(automation)
    return default


async def async_requester_name(hass: HomeAssistant, requester: str) -> str:
    """Name a requester as the household knows it: the HA user, satellite or automation.

    Falls back to the requester id when it names nothing Home Assistant knows.
    """
    kind, _, ident = requester.partition(":")
    name: str | None = None
    if kind == "user" and ident:
        if (user := await hass.auth.async_get_user(ident)) is not None:
            name = user.name
    elif kind == "device" and ident:
        if (device := dr.async_get(hass).async_get(ident)) is not None:
            name = device.name_by_user or device.name
    elif kind == "automation" and ident:
        if (state := hass.states.get(ident)) is not None:
            name = state.attributes.get(ATTR_FRIENDLY_NAME)
        elif (registry_entry := er.async_get(hass).async_get(ident)) is not None:
            name = registry_entry.name or registry_entry.original_name
    elif kind == "job" and ident:
        name = ident
    elif kind == "client" and ident:
        name = next(
            (
                subentry.title
                for entry in hass.config_entries.async_entries(DOMAIN)
                if (subentry := entry.subentries.get(ident)) is not None
            ),
            None,
        )
    elif requester == AI_TASK_REQUESTER:
        name = "AI Task"
    return str(name) if name else requester
