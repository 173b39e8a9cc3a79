"""``job.json``'s ``privacy`` (a fleet round's local differential privacy): the spec only, no numpy,
so the job spec and the agent's light commands load without it; the clipping and noise are
:mod:`device_agent.privacy`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from device_agent.wire import SpecError, get_field, reject_unknown


@dataclass(frozen=True)
class LocalPrivacy:
    """How a board privatises its update: the clipping norm and the noise multiplier."""

    clip: float
    noise_multiplier: float

    def to_dict(self) -> dict[str, Any]:
        """The wire form (``job.json``'s ``privacy``)."""
        return {"clip": self.clip, "noise_multiplier": self.noise_multiplier}

    @classmethod
    def from_dict(cls, d: object, where: str = "privacy") -> LocalPrivacy:
        """Read and check the wire form: both finite numbers > 0 (SpecError naming the field)."""
        if not isinstance(d, dict):
            raise SpecError(where, "an object with clip and noise_multiplier", d)
        reject_unknown(d, {"clip", "noise_multiplier"}, where)
        values = {k: get_field(d, k, (int, float), where) for k in ("clip", "noise_multiplier")}
        for key, value in values.items():
            if not (math.isfinite(value) and value > 0):
                raise SpecError(f"{where}.{key}", "a finite number > 0", value)
        return cls(float(values["clip"]), float(values["noise_multiplier"]))
