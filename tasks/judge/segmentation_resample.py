"""The promotion gate's paired bootstrap for segmentation: resample the test images, recompute
both models' mIoU (or pixel accuracy) from the summed confusion matrices of the images drawn, and
take the percentile interval of the gain.

Both models see the same resamples, so the interval is of the paired gain; a resample's metric is
exactly the metric of that image list (a sum of per-image confusion matrices is the matrix of the
pixels of those images). The same resamples give each class's IoU gain and the gain of the object
classes' mIoU (every class but the background): a model that learns only the background can raise
mIoU over a poor reference, never the object classes' mIoU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.errors import EvaluationError
from tasks.judge.segmentation import class_iou, mean_iou, object_classes, pixel_accuracy

RESAMPLES = 2000
CHUNK = 250  # resamples whose matrices are summed at once


def _matrices(record: dict[str, Any]) -> np.ndarray:
    return np.asarray(record["confusion"], np.float64)


def _scores(cms: np.ndarray, metric: str, objects: np.ndarray) -> dict[str, np.ndarray]:
    """Per resample (``cms``: ``[B, C, C]``): the metric, each class's IoU and the objects' mIoU."""
    iou = class_iou(cms)
    value = pixel_accuracy(cms) if metric == "pixel_accuracy" else mean_iou(iou)
    return {"metric": value, "iou": iou, "objects": mean_iou(iou, objects)}


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    kept = values[~np.isnan(values)]
    if not len(kept):
        return 0.0, 0.0
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(kept, [tail, 100 - tail])
    return float(low), float(high)


def paired_iou_bootstrap(candidate: dict[str, Any], reference: dict[str, Any], metric: str, confidence: float,
                         class_names: list[str] | None = None, resamples: int = RESAMPLES,
                         seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """The percentile interval of the candidate's ``metric`` gain (``miou`` or ``pixel_accuracy``)
    over the reference on the same resamples of the test images, each class's IoU gain interval
    (``per_class``) and, with a background class, the object classes' mIoU gain (``objects``)."""
    cand, ref = _matrices(candidate), _matrices(reference)
    if cand.shape != ref.shape or cand.ndim != 3:
        raise EvaluationError(
            f"{metric} bootstrap: the candidate's confusion matrices are {list(cand.shape)}, "
            f"the reference's {list(ref.shape)} (the same test images and classes are needed)"
        )
    n, classes = cand.shape[0], cand.shape[1]
    background = int(candidate.get("background", -1))
    objects = object_classes(classes, background)
    rng = np.random.default_rng(seed)
    gains: dict[str, list[np.ndarray]] = {"metric": [], "iou": [], "objects": []}
    for start in range(0, resamples, CHUNK):
        rows = min(CHUNK, resamples - start)
        counts = np.zeros((rows, n))
        np.add.at(counts, (np.repeat(np.arange(rows), n), rng.integers(0, n, size=rows * n)), 1.0)
        c = _scores(np.einsum("bn,nij->bij", counts, cand), metric, objects)
        r = _scores(np.einsum("bn,nij->bij", counts, ref), metric, objects)
        for key in gains:
            gains[key].append(c[key] - r[key])
    whole_c, whole_r = (_scores(m.sum(axis=0)[None], metric, objects) for m in (cand, ref))
    low, high = _interval(np.concatenate(gains["metric"]), confidence)
    names = class_names or [str(k) for k in range(classes)]
    per_class_gain = np.concatenate(gains["iou"])
    out: dict[str, Any] = {
        "test": f"paired bootstrap over {n} test images, {confidence:.0%} CI of the {metric} gain",
        "low": low,
        "high": high,
        "gain": float(whole_c["metric"][0] - whole_r["metric"][0]),
        "resamples": resamples,
        "per_class": {
            name: [round(v, 6) for v in _interval(per_class_gain[:, k], confidence)]
            for k, name in enumerate(names)
            if not np.isnan(per_class_gain[:, k]).all()
        },
    }
    if 0 <= background < classes:
        o_low, o_high = _interval(np.concatenate(gains["objects"]), confidence)
        predicted = cand.sum(axis=0)
        out["objects"] = {
            "low": o_low,
            "high": o_high,
            "candidate": float(np.nan_to_num(whole_c["objects"][0])),
            "reference": float(np.nan_to_num(whole_r["objects"][0])),
            "gain": float(np.nan_to_num(whole_c["objects"][0] - whole_r["objects"][0])),
            "background": names[background],
            "predicted_background": float(predicted[:, background].sum() / max(predicted.sum(), 1.0)),
        }
    return out
