"""``job.json``'s ``keypoints`` (task keypoints): how the board decodes and scores its epochs' PCK,
the recipe's ``[keypoints]`` values, so the board's figure is the host's. The spec only, no numpy;
the decoding and PCK are :mod:`device_agent.keypoints`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from device_agent.wire import SpecError, get_field, reject_unknown

PCK_THRESHOLD = 0.1  # PCK's default: within this share of the labelled keypoints' box's larger side


@dataclass(frozen=True)
class KeypointsScoring:
    """PCK's threshold (a share of the box's larger side) and whether heatmaps decode subpixel."""

    pck_threshold: float = PCK_THRESHOLD
    subpixel: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The wire form (``job.json``'s ``keypoints``)."""
        return {"pck_threshold": self.pck_threshold, "subpixel": self.subpixel}

    @classmethod
    def from_dict(cls, d: object, where: str = "keypoints") -> KeypointsScoring:
        """Read and check the wire form: a threshold in (0, 1], subpixel a boolean."""
        if not isinstance(d, dict):
            raise SpecError(where, "an object with pck_threshold and subpixel", d)
        reject_unknown(d, {"pck_threshold", "subpixel"}, where)
        threshold = get_field(d, "pck_threshold", (int, float), where, PCK_THRESHOLD)
        if not (math.isfinite(threshold) and 0 < threshold <= 1):
            raise SpecError(f"{where}.pck_threshold", "a number in (0, 1]", threshold)
        return cls(float(threshold), get_field(d, "subpixel", bool, where, True))
