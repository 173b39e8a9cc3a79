"""COCO mAP of any resample of the test images, exactly, from one COCOeval run per model.

The promotion gate judges a detector's mAP gain by a paired bootstrap over test images: resample
the images with replacement, compute both models' mAP on the same resample, and take the interval
of the gain. Running pycocotools once per resample and model would take minutes; it is not needed,
because COCO's matching is decided per image and class (``COCOeval.evaluateImg``): which detection
matched a ground truth at each IoU threshold, which are ignored, how many ground truths count.
:func:`match_records` keeps those per-image outcomes from one evaluation, and :func:`map_from_records`
repeats ``COCOeval.accumulate`` (area "all", the largest maxDets) for many resamples at once: an
image drawn *c* times weighs its detections and ground truths *c* times.

Why weights are exact: a resample lists an image's detections *c* times in a row of the ranking
(stable sort by score; ties between different images aside, which pycocotools orders by image).
Repeating a true positive adds precision/recall points whose precision only rises, so after the
right-to-left running maximum the interpolated precision at every recall threshold is the same
as with the last repeat alone; repeating a false positive adds points of lower precision at the
same recall, which never set the envelope. So cumulative sums of weights give the same precision
at the 101 recall thresholds as listing the repeats (the tests compare with pycocotools on
duplicated image lists).

Records marked ``"ties": "grouped"`` (keypoints: a coordinate output has no confidence, so every
instance scores 1) rank tied detections as one block, as scikit-learn's average precision does:
they enter the precision/recall curve together, at the block's last cumulative counts, so the AP
does not depend on the order of the test images (pycocotools orders ties by image).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from tasks.errors import EvaluationError

RECALL_POINTS = np.linspace(0.0, 1.0, 101)
METRIC_THRESHOLDS = {"map": None, "map50": 0.5, "map75": 0.75}  # None: every IoU threshold .5:.95
BOOTSTRAP_RESAMPLES = 1000
CHUNK = 100  # resamples computed together (memory: CHUNK x detections per class)


def match_records(ev: Any) -> dict[str, Any]:
    """Per class, every kept detection's image, score, match and ignore bitmasks (bit t: at IoU
    threshold t), and per image the number of ground truths that count, from an evaluated COCOeval
    (``evaluate()`` done): area range "all", the last ``maxDets``. Plain lists, JSON-able."""
    p = ev.params
    n_images, n_areas = len(p.imgIds), len(p.areaRng)
    max_det = p.maxDets[-1]
    bits = 1 << np.arange(len(p.iouThrs), dtype=np.int64)
    classes = []
    for k in range(len(p.catIds)):
        image, score, match, ignore, gt = [], [], [], [], []
        for i in range(n_images):
            e = ev.evalImgs[k * n_areas * n_images + i]  # area index 0: "all"
            if e is None:
                gt.append(0)
                continue
            gt.append(int(np.count_nonzero(np.asarray(e["gtIgnore"]) == 0)))
            d = len(e["dtScores"][:max_det])
            if not d:
                continue
            m = np.asarray(e["dtMatches"])[:, :d] > 0
            ig = np.asarray(e["dtIgnore"])[:, :d].astype(bool)
            image += [i] * d
            score += [float(s) for s in e["dtScores"][:d]]
            match += (bits[:, None] * m).sum(axis=0).tolist()
            ignore += (bits[:, None] * ig).sum(axis=0).tolist()
        classes.append({"image": image, "score": score, "match": match, "ignore": ignore, "gt": gt})
    return {"images": n_images, "iou_thresholds": [float(t) for t in p.iouThrs], "classes": classes}


def no_detection_records(gt_counts: np.ndarray, iou_thresholds: list[float]) -> dict[str, Any]:
    """The records of a model that detected nothing: ``gt_counts`` is ``[classes, images]``."""
    classes = [
        {"image": [], "score": [], "match": [], "ignore": [], "gt": [int(c) for c in row]}
        for row in gt_counts
    ]
    return {"images": int(gt_counts.shape[1]), "iou_thresholds": list(iou_thresholds), "classes": classes}


def map_from_records(
    records: dict[str, Any], counts: np.ndarray, metric: str = "map"
) -> dict[str, np.ndarray]:
    """``metric`` ("map", "map50", "map75") for each row of ``counts`` ([B, images]: how often each
    image is drawn; all ones = the full test set) and ``per_class`` [B, classes] (NaN where the
    class has no ground truth in that resample). A resample without any ground truth scores 0."""
    counts = np.atleast_2d(np.asarray(counts, np.float64))
    if counts.shape[1] != records["images"]:
        raise EvaluationError(f"resample over {counts.shape[1]} images for records of {records['images']}")
    thresholds = np.asarray(records["iou_thresholds"])
    wanted = METRIC_THRESHOLDS[metric]
    use = np.arange(len(thresholds)) if wanted is None else np.flatnonzero(np.isclose(thresholds, wanted))
    if not len(use):
        raise EvaluationError(f"{metric}: the evaluation has no IoU threshold {wanted}")
    grouped = records.get("ties") == "grouped"
    per_class = np.stack([_class_ap(c, counts, use, grouped) for c in records["classes"]], axis=1)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample without ground truth: NaN -> 0
        value = np.nan_to_num(np.nanmean(per_class, axis=1), nan=0.0)
    return {metric: value, "per_class": per_class}


def _class_ap(c: dict[str, Any], counts: np.ndarray, use: np.ndarray, grouped: bool = False) -> np.ndarray:
    """One class's AP averaged over the IoU thresholds ``use``, per resample (NaN: no ground truth);
    ``grouped``: tied scores count as one block."""
    npig = counts @ np.asarray(c["gt"], np.float64)
    out = np.full(len(counts), np.nan)
    has_gt = npig > 0
    if not len(c["score"]):
        out[has_gt] = 0.0
        return out
    order = np.argsort(-np.asarray(c["score"]), kind="mergesort")
    ranked = -np.asarray(c["score"])[order]
    block_end = np.searchsorted(ranked, ranked, side="right") - 1 if grouped else np.arange(len(order))
    image = np.asarray(c["image"])[order]
    match = np.asarray(c["match"], np.int64)[order]
    ignore = np.asarray(c["ignore"], np.int64)[order]
    weights = counts[:, image]  # [B, D]
    aps = np.zeros((len(counts), len(use)))
    for j, t in enumerate(use):
        hit = (match >> t) & 1 == 1
        kept = (ignore >> t) & 1 == 0
        tp = np.cumsum(weights * (hit & kept), axis=1)[:, block_end]
        fp = np.cumsum(weights * (~hit & kept), axis=1)[:, block_end]
        with np.errstate(invalid="ignore", divide="ignore"):
            recall = tp / npig[:, None]
        precision = tp / (tp + fp + np.spacing(1))
        envelope = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
        for b in np.flatnonzero(has_gt):
            at = np.searchsorted(recall[b], RECALL_POINTS, side="left")
            ok = at < recall.shape[1]
            aps[b, j] = envelope[b, at[ok]].sum() / len(RECALL_POINTS)
    out[has_gt] = aps[has_gt].mean(axis=1)
    return out


def paired_map_bootstrap(
    candidate: dict[str, Any],
    reference: dict[str, Any],
    metric: str,
    confidence: float,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    class_names: list[str] | None = None,
) -> dict[str, Any]:
    """The percentile interval of the candidate's ``metric`` gain over the reference on the same
    resamples of the test images (and of each class's AP gain at the metric's IoU thresholds)."""
    n = candidate["images"]
    if reference["images"] != n or len(candidate["classes"]) != len(reference["classes"]):
        raise EvaluationError(
            f"{metric} bootstrap: the candidate was evaluated on {n} images and "
            f"{len(candidate['classes'])} classes, the reference on {reference['images']} and "
            f"{len(reference['classes'])}"
        )
    rng = np.random.default_rng(seed)
    gains, class_gains = [], []
    for start in range(0, resamples, CHUNK):
        rows = min(CHUNK, resamples - start)
        draws = rng.integers(0, n, size=(rows, n))
        counts = np.zeros((rows, n))
        np.add.at(counts, (np.repeat(np.arange(rows), n), draws.ravel()), 1.0)
        c, r = map_from_records(candidate, counts, metric), map_from_records(reference, counts, metric)
        gains.append(c[metric] - r[metric])
        class_gains.append(c["per_class"] - r["per_class"])
    gain, per_class = np.concatenate(gains), np.concatenate(class_gains)
    full = map_from_records(candidate, np.ones((1, n)), metric)[metric][0]
    full -= map_from_records(reference, np.ones((1, n)), metric)[metric][0]
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(gain, [tail, 100 - tail])
    names = class_names or [str(k) for k in range(per_class.shape[1])]
    classes = {}
    for k, name in enumerate(names):
        col = per_class[:, k][~np.isnan(per_class[:, k])]
        if len(col):
            lo, hi = np.percentile(col, [tail, 100 - tail])
            classes[name] = [round(float(lo), 6), round(float(hi), 6)]
    return {
        "test": f"paired bootstrap over {n} test images, {confidence:.0%} CI of the {metric} gain",
        "low": float(low),
        "high": float(high),
        "gain": float(full),
        "resamples": resamples,
        "per_class": classes,
    }
