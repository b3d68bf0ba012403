"""Who is charged for a request: requester ids, the ones a server keeps, and their names.

``user:<ha user id>``, ``device:<device id>`` (a voice satellite), ``automation:<entity id>``,
``ai_task`` (an AI Task call from an unknown automation), ``generate``, ``job:<job name>`` (a named
job), ``job`` (unnamed jobs), ``client:<subentry id>`` (an app using the gateway with its client
key), free names, and ``other``.

Every requester a scheduler sees stays in its statistics and gets a token sensor, so the ids an
action is given are bounded (``REQUESTER_ID``) and kept only when they last: users, devices and
automations Home Assistant knows always; named requesters (job names, clients, free names) up to
``MAX_NAMED_REQUESTERS`` per server. Everything else is charged as ``other``
(``RequesterRegistry``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from enum import StrEnum
import re
from typing import Final

from homeassistant.const import ATTR_FRIENDLY_NAME
from homeassistant.core import Context, HomeAssistant, callback
from homeassistant.helpers import device_registry as dr, entity_registry as er
from homeassistant.util import slugify

from custom_components.llm_lanes.const import DOMAIN

AI_TASK_REQUESTER: Final = "ai_task"
JOBS_REQUESTER: Final = "job"
"""Who unnamed jobs are charged to when no user or automation asked for them."""
OTHER_REQUESTER: Final = "other"
"""Where the tokens of requesters a server does not keep go."""
AUTOMATION_DOMAIN: Final = "automation"
REQUESTER_MAX_LENGTH: Final = 128
REQUESTER_ID: Final = re.compile(rf"[A-Za-z0-9_.:@-]{{1,{REQUESTER_MAX_LENGTH}}}")
"""What a requester id may be: short, printable, no spaces (it ends up in a unique id)."""
MAX_NAMED_REQUESTERS: Final = 50
"""Named requesters (job names, clients, free names) a server keeps; later ones count as other."""
REQUESTER_TOKENS_KEY: Final = "requester_tokens"
"""Prefix of the key (and unique id suffix) of a per-requester token sensor."""


class _Kind(StrEnum):
    """What a requester id ``kind:ident`` names (``_requester`` builds one)."""

    USER = "user"
    DEVICE = "device"
    """A voice satellite."""
    AUTOMATION = AUTOMATION_DOMAIN
    CLIENT = "client"
    """A gateway client (``client:<subentry id>``)."""
    JOB = "job"
    """A named job (``job:<slug of its name>``)."""


_LASTING_KINDS: Final = frozenset({_Kind.USER, _Kind.DEVICE, _Kind.AUTOMATION})
"""Kinds of requesters that Home Assistant's own registries bound."""
_FIXED: Final = frozenset(
    {AI_TASK_REQUESTER, JOBS_REQUESTER, OTHER_REQUESTER, "generate"}
)


def _requester(kind: _Kind, ident: str) -> str:
    """Name the requester ``ident`` of a ``kind``: ``kind:ident`` (split at the first colon)."""
    return f"{kind}:{ident}"


def user_requester(user_id: str) -> str:
    """Name the requester of a Home Assistant user."""
    return _requester(_Kind.USER, user_id)


def device_requester(device_id: str) -> str:
    """Name the requester of a device (a voice satellite)."""
    return _requester(_Kind.DEVICE, device_id)


def automation_requester(entity_id: str) -> str:
    """Name the requester of an automation."""
    return _requester(_Kind.AUTOMATION, entity_id)


def job_requester(name: str | None) -> str:
    """Name the requester of a stored job: ``job:<slug of its name>``, or ``job`` without one."""
    slug = slugify(name or "")[: REQUESTER_MAX_LENGTH - 4]
    return _requester(_Kind.JOB, slug) if slug else JOBS_REQUESTER


def is_requester_id(value: str) -> bool:
    """Whether ``value`` is a well-formed requester id (length and characters)."""
    return REQUESTER_ID.fullmatch(value) is not None


def client_requester(subentry_id: str) -> str:
    """Name the requester of a gateway client (its subentry)."""
    return _requester(_Kind.CLIENT, subentry_id)


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


def requester_sensor_prefix(entry_id: str) -> str:
    """Return the unique id of a requester's token sensor, less the requester id."""
    return f"{entry_id}_{REQUESTER_TOKENS_KEY}_"


def requesters_with_sensors(hass: HomeAssistant, entry_id: str) -> set[str]:
    """Return the requesters of a server that have a token sensor (kept across restarts)."""
    prefix = requester_sensor_prefix(entry_id)
    return {
        registry_entry.unique_id.removeprefix(prefix)
        for registry_entry in er.async_entries_for_config_entry(
            er.async_get(hass), entry_id
        )
        if registry_entry.domain == "sensor"
        and registry_entry.unique_id.startswith(prefix)
    }


@callback
def async_remove_deleted_client_sensors(
    hass: HomeAssistant, entry_id: str, client_ids: Collection[str]
) -> None:
    """Remove the token sensors of the server's gateway clients that were deleted.

    A client's token sensor belongs to the server entry, not to the client's subentry (that
    would add the server's device to every client in the UI), so Home Assistant keeps it when
    the subentry is deleted; it is removed here, from the entity registry, whence the dashboard
    builds its totals. Run at set-up (a client deleted while the entry was not loaded) and
    whenever the entry changes.
    """
    registry = er.async_get(hass)
    prefix = requester_sensor_prefix(entry_id)
    for registry_entry in er.async_entries_for_config_entry(registry, entry_id):
        if registry_entry.domain != "sensor" or not registry_entry.unique_id.startswith(
            prefix
        ):
            continue
        kind, _, ident = registry_entry.unique_id.removeprefix(prefix).partition(":")
        if kind == _Kind.CLIENT and ident not in client_ids:
            registry.async_remove(registry_entry.entity_id)


async def _async_known_name(
    hass: HomeAssistant, kind: str, ident: str
) -> tuple[bool, str | None]:
    """Whether Home Assistant knows this user, device or automation, and what it calls it."""
    if kind == _Kind.USER:
        user = await hass.auth.async_get_user(ident)
        return user is not None, user.name if user is not None else None
    if kind == _Kind.DEVICE:
        device = dr.async_get(hass).async_get(ident)
        if device is None:
            return False, None
        return True, device.name_by_user or device.name
    if kind == _Kind.AUTOMATION and ident.startswith(f"{AUTOMATION_DOMAIN}."):
        if (state := hass.states.get(ident)) is not None:
            return True, state.attributes.get(ATTR_FRIENDLY_NAME)
        if (registry_entry := er.async_get(hass).async_get(ident)) is not None:
            return True, registry_entry.name or registry_entry.original_name
    return False, None


class RequesterRegistry:
    """The requesters one server charges under their own id; the rest are charged as ``other``.

    Users, devices and automations Home Assistant knows are always their own requester (its
    registries bound them); one it does not know is ``other``. Named requesters are admitted until
    ``limit`` of them are known, then ``other`` too. Requesters with a token sensor from before a
    restart, and those the options give a quota, are known from the start (even past the limit).
    """

    def __init__(
        self, known: Iterable[str] = (), *, limit: int = MAX_NAMED_REQUESTERS
    ) -> None:
        """Start with the ``known`` requesters (malformed ids are left out)."""
        self._limit = limit
        self._named: set[str] = set()
        self.allow(known)

    def allow(self, requesters: Iterable[str]) -> None:
        """Keep these requesters whatever the limit (the options name them)."""
        self._named.update(
            requester
            for requester in requesters
            if is_requester_id(requester)
            and requester.partition(":")[0] not in _LASTING_KINDS
        )

    @property
    def named_count(self) -> int:
        """How many named requesters the server keeps."""
        return len(self._named)

    async def async_charge_as(self, hass: HomeAssistant, requester: str) -> str:
        """Return the requester to charge for ``requester`` (itself, or ``other``)."""
        if not is_requester_id(requester):
            return OTHER_REQUESTER
        kind, sep, ident = requester.partition(":")
        if sep and kind in _LASTING_KINDS:
            known, _ = await _async_known_name(hass, kind, ident)
            return requester if known else OTHER_REQUESTER
        if requester in _FIXED or requester in self._named:
            return requester
        if len(self._named) >= self._limit:
            return OTHER_REQUESTER
        self._named.add(requester)
        return requester


async def async_requester_name(hass: HomeAssistant, requester: str) -> str:
    """Name a requester as the household knows it: the HA user, satellite or automation.

    Falls back to the requester id when it names nothing Home Assistant knows.
    """
    kind, _, ident = requester.partition(":")
    name: str | None = None
    if kind in _LASTING_KINDS and ident:
        _, name = await _async_known_name(hass, kind, ident)
    elif kind == _Kind.JOB and ident:
        name = ident
    elif kind == _Kind.CLIENT and ident:
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
