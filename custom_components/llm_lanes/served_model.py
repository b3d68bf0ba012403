"""What a server runs an entry's model as, and whether it has it loaded (from what it reports).

Below the coordinators that poll it and the calibration that holds for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from custom_components.llm_lanes.core.backends.base import ServerInfo
from custom_components.llm_lanes.core.backends.kinds import server_profile
from custom_components.llm_lanes.core.backends.server_metrics import ServerMetrics


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the server runs the entry's model as: what a measurement of the server holds for.

    A measurement (the learned batch curve, what ``run_benchmark`` applied) no longer holds once
    another model runs, another variant of it (file, quantization), or with another context.
    """

    model: str
    variant: str | None = None
    """Its file, digest or quantization (``ServerInfo.model_variants``), where the server says."""
    context_per_slot: int | None = None

    def changed_from(self, before: ServedModel) -> bool:
        """Whether this differs from ``before`` in the model, or in a fact both know."""
        return self.model != before.model or any(
            now is not None and then is not None and now != then
            for now, then in (
                (self.variant, before.variant),
                (self.context_per_slot, before.context_per_slot),
            )
        )

    def describe(self) -> str:
        """Say it in a line: ``model [variant], context per slot``."""
        variant = f" [{self.variant}]" if self.variant else ""
        context = f", {self.context_per_slot}" if self.context_per_slot else ""
        return f"{self.model}{variant}{context}"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON (for the store)."""
        return {
            "model": self.model,
            "variant": self.variant,
            "context_per_slot": self.context_per_slot,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServedModel:
        """Read what ``as_dict`` wrote."""
        return cls(
            model=str(data["model"]),
            variant=data.get("variant"),
            context_per_slot=data.get("context_per_slot"),
        )


def variant_of(info: ServerInfo, model: str) -> str | None:
    """Return what ``model`` runs as at the server (Ollama names default to ``latest``)."""
    variants = info.model_variants
    if model in variants:
        return variants[model]
    return variants.get(f"{model}:latest") if ":" not in model else None


def model_is_loaded(model: str, info: ServerInfo, metrics: ServerMetrics) -> bool:
    """Tell whether ``model`` is loaded, from whatever the server reports."""
    loaded = set(info.loaded_models) | set(metrics.loaded_models)
    if loaded or server_profile(info.kind).unloads_models:
        # Servers that unload models list what is resident: an empty list means nothing is.
        return model in loaded
    # Servers that do not report residency.
    return model in info.models
