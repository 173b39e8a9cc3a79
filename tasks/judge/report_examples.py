"""The test images a report draws its examples on: each example image of the models' evaluations
with the truth and every model's prediction of it (a segmentation's masks, keypoints)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Panels = dict[str, np.ndarray]  # title ("truth", then each model's column) -> what to draw


def example_panels(evaluations: dict[str, dict[str, Any]], test_path: Path | None, marker: str, field: str,
                   truth: Callable[[np.ndarray], np.ndarray] = np.asarray) -> tuple[dict[str, Any], list[tuple[np.ndarray, Panels]]]:  # fmt: skip
    """The last model judged with ``marker`` in its metrics (``{}`` when none is) and, for each of its
    ``examples``, the test image ``x[i]`` with its panels: ``truth(y[i])``, then each such model's
    ``example[field]`` of that image."""
    cols = [c for c, m in evaluations.items() if m.get("examples") and marker in m]
    if not cols or test_path is None or not Path(test_path).is_file():
        return {}, []
    last = evaluations[cols[-1]]
    with np.load(test_path) as data:
        if not {"x", "y"} <= set(data.files):
            return {}, []
        x, y = data["x"], data["y"]
    out = []
    for k, example in enumerate(last["examples"]):
        i = example["index"]
        if i >= len(x):
            continue
        panels = {"truth": truth(y[i])}
        for c in cols:
            found = evaluations[c]["examples"]
            if k < len(found) and found[k]["index"] == i:
                panels[c] = np.asarray(found[k][field])
        out.append((x[i], panels))
    return last, out
