"""Translated Home Assistant errors, and the one place where ``core.errors`` is translated.

Every engine error carries its translation key and placeholders, so the translation needs no
string matching. A request refused at the door — it breaks a lane limit, its lane's queue is full,
its requester's quota is spent — is a validation error: nothing was sent, and the caller has to
change the call or try again later. Home Assistant answers those to a REST caller with HTTP 400
and the translated message, and to a WebSocket caller with ``service_validation_error`` and the
translation key. Anything else the scheduler or the server says is a plain Home Assistant error
(HTTP 500, ``home_assistant_error``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from homeassistant.exceptions import HomeAssistantError, ServiceValidationError

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.core.errors import REFUSALS, LanesError
from custom_components.llm_lanes.core.slot_context import fits


def validation_error(
    translation_key: str, **placeholders: str
) -> ServiceValidationError:
    """Build the translated error of a call the caller has to change."""
    return ServiceValidationError(
        translation_domain=DOMAIN,
        translation_key=translation_key,
        translation_placeholders=placeholders or None,
    )


def refuse_unless_fits(
    translation_key: str, prompt_tokens: int, output_tokens: int, context: int | None
) -> None:
    """Raise the translated ``translation_key`` error, with the numbers, when a request cannot fit.

    ``context`` is what one request may hold at the server (its slot); None: unknown, it fits.
    """
    if not fits(prompt_tokens, output_tokens, context):
        raise validation_error(
            translation_key,
            prompt_tokens=str(prompt_tokens),
            output_tokens=str(output_tokens),
            context=str(context),
        )


def failure(translation_key: str, **placeholders: str) -> HomeAssistantError:
    """Build the translated error of a call that failed through no fault of the caller."""
    return HomeAssistantError(
        translation_domain=DOMAIN,
        translation_key=translation_key,
        translation_placeholders=placeholders or None,
    )


@contextmanager
def translated_errors() -> Iterator[None]:
    """Raise the engine errors of the block as translated Home Assistant errors."""
    try:
        yield
    except REFUSALS as err:
        raise validation_error(err.translation_key, **err.placeholders) from err
    except LanesError as err:
        raise failure(err.translation_key, **err.placeholders) from err
