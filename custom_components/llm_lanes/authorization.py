"""Who may change a server's settings: the one rule of LLM Lanes, for every way in.

A server's settings (the options, which the options flow edits) belong to Home Assistant's
admins: Home Assistant opens the options flow to admins only, and the same holds for what changes
the settings otherwise, the setting controls (numbers, select, switches) and ``run_benchmark``'s
``apply`` and ``force``. A change without a user (an automation, a script it runs, Home Assistant
itself) or by an admin goes through; a user who is not an admin is refused with ``AdminOnly``
(Home Assistant's ``Unauthorized``: HTTP 401 to a REST caller, translated for the frontend).
"""

from __future__ import annotations

from homeassistant.auth.models import User
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import Unauthorized, UnknownUser

from custom_components.llm_lanes.const import DOMAIN


class AdminOnly(Unauthorized):
    """A user who is not an admin tried to change a server's settings (translated)."""

    def __init__(self, context: Context, *, entity_id: str | None = None) -> None:
        """Refuse the user of ``context``; the translation names nothing but the rule."""
        super().__init__(context=context, entity_id=entity_id)
        self.translation_domain = DOMAIN
        self.translation_key = "admin_only"
        # Its message is the translation's (Home Assistant's own ``Unauthorized`` says only that).
        self.generate_message = True


async def async_caller(hass: HomeAssistant, context: Context) -> User | None:
    """Return the user who made the call (None: an automation, a script, Home Assistant).

    A context naming a user Home Assistant does not know is ``UnknownUser``.
    """
    if not (user_id := context.user_id):
        return None
    user = await hass.auth.async_get_user(user_id)
    if user is None:
        raise UnknownUser(context=context)
    return user


def is_restricted(user: User | None) -> bool:
    """Whether the caller is a user who is not an admin (an automation is not restricted)."""
    return user is not None and not user.is_admin


async def async_require_admin(
    hass: HomeAssistant, context: Context | None, *, entity_id: str | None = None
) -> None:
    """Refuse a change of a server's settings by a user who is not an admin (``AdminOnly``)."""
    if context is not None and is_restricted(await async_caller(hass, context)):
        raise AdminOnly(context, entity_id=entity_id)
