"""The calibration on record for one entry: what it measured on, the curve, what it applied.

Kept across restarts (``Calibration``: one store document per entry), with whether a
re-calibration is planned for the night. Below the entry's runtime data, which holds it; the
action that calibrates, and what makes a record stale, are ``calibration.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from homeassistant.core import HomeAssistant
from homeassistant.helpers.storage import Store

from custom_components.llm_lanes.const import DOMAIN
from custom_components.llm_lanes.served_model import ServedModel

STORAGE_VERSION: Final = 1


@dataclass(slots=True, kw_only=True)
class CalibrationRecord:
    """One calibration: what it measured on, the curve, its chart and what it applied."""

    measured_on: ServedModel
    measured_at: str
    """ISO time of the run."""
    curve: list[tuple[int, float]] = field(default_factory=list)
    """(sequences in flight, ITL p50) of the measured curve: what seeds the learned one."""
    plot: str | None = None
    """The curve as an SVG chart."""
    applied: dict[str, int] = field(default_factory=dict)
    """The options ``apply`` wrote (empty: none)."""
    stale: bool = False
    """The server no longer runs what was measured: the curve and settings were forgotten."""

    def as_stored(self) -> dict[str, Any]:
        """Plain JSON for the store."""
        return {
            "measured_on": self.measured_on.as_dict(),
            "measured_at": self.measured_at,
            "curve": [list(point) for point in self.curve],
            "plot": self.plot,
            "applied": dict(self.applied),
            "stale": self.stale,
        }

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> CalibrationRecord:
        """Read what ``as_stored`` wrote."""
        return cls(
            measured_on=ServedModel.from_dict(data["measured_on"]),
            measured_at=str(data["measured_at"]),
            curve=[(int(size), float(itl)) for size, itl in data["curve"]],
            plot=data["plot"],
            applied={key: int(value) for key, value in data["applied"].items()},
            stale=bool(data["stale"]),
        )


class Calibration:
    """The calibration on record for one entry, and whether one is planned for the night."""

    def __init__(self, hass: HomeAssistant, entry_id: str) -> None:
        """Bind to the entry's store document; nothing is read before ``async_load``."""
        self._store: Store[dict[str, Any]] = Store(
            hass,
            STORAGE_VERSION,
            f"{DOMAIN}.calibration.{entry_id}",
            private=True,
            atomic_writes=True,
        )
        self.record: CalibrationRecord | None = None
        self.planned = False
        """A re-calibration runs in the next night's job window (``jobs.recalibration``)."""

    async def async_load(self) -> None:
        """Read the record and the plan."""
        data = await self._store.async_load() or {}
        record = data.get("record")
        self.record = CalibrationRecord.from_stored(record) if record else None
        self.planned = bool(data.get("planned", False))

    async def async_save(self) -> None:
        """Write the record and the plan."""
        await self._store.async_save(
            {
                "record": self.record.as_stored() if self.record else None,
                "planned": self.planned,
            }
        )

    async def async_remove(self) -> None:
        """Forget everything (the entry is deleted)."""
        await self._store.async_remove()
