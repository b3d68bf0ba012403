"""Engine errors as Home Assistant errors: the one place where ``core.errors`` is translated.

Every engine error carries its translation key and placeholders, so the translation needs no
string matching. A request that breaks a lane limit is the caller's to fix (a validation error);
anything else the scheduler or the server says is a plain Home Assistant error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from homeassistant.exceptions import HomeAssistantError, ServiceValidationError

from .const import DOMAIN
from .core.errors import LanesError, LimitExceededError


@contextmanager
def translated_errors() -> Iterator[None]:
    """Raise the engine errors of the block as translated Home Assistant errors."""
    try:
        yield
    except LanesError as err:
        error_type = (
            ServiceValidationError
            if isinstance(err, LimitExceededError)
            else HomeAssistantError
        )
        raise error_type(
            translation_domain=DOMAIN,
            translation_key=err.translation_key,
            translation_placeholders=err.placeholders,
        ) from err
