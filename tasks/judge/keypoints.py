"""Keypoints (pose estimation) on the host: COCO's OKS-based AP by pycocotools, PCK, per-keypoint
figures and the numpy twin of the training loss, from a model's heatmaps ``[N, K, H, W]`` or
coordinates ``[N, K, 2]`` against COCO labels ``[N, K, 3]`` (:mod:`tasks.recipe.keypoints`).

* Decoding: the board's own (:func:`device_agent.keypoints.decode`: a heatmap's argmax cell centre,
  a quarter cell towards the higher neighbour with ``subpixel``, the peak as its score; coordinates
  as they are); the instance's score (which ranks it for AP) is the mean of its keypoints' scores:
  a heatmap's peak values. Coordinates carry no confidence, so every instance scores 1: tied
  instances rank as one block (:mod:`tasks.judge.coco_resample`'s grouped ties), the AP of a model
  that ranks nothing, the same whatever the test images' order (pycocotools would order them by
  image, making the AP depend on which images come first).
* AP: each test image is one image of one instance (COCO's ``person`` category); pycocotools'
  ``COCOeval(iouType="keypoints")`` with the recipe's OKS sigmas scores it, the ground truth's
  ``area`` being its labelled keypoints' bounding box (the scale OKS divides by; an image without a
  labelled keypoint is ignored, as COCO ignores ``num_keypoints = 0``). ``oks_ap`` is AP at OKS
  .50:.95, ``oks_ap50`` and ``oks_ap75`` at one threshold (area "all", COCO's 20 detections),
  accumulated from the matches as the gate's bootstrap accumulates them.
* PCK: a labelled keypoint is right within ``pck_threshold`` of its box's larger side; ``pck`` is
  the mean over images of each image's share.

The per-image COCO matches (:func:`tasks.judge.coco_resample.match_records`) stay in the metrics
(``per_sample["keypoints"]``) for the promotion gate's paired bootstrap over images, as a detector's do.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np

from device_agent.keypoints import MIN_SIDE, boxes, decode, pck_hits
from tasks.errors import EvaluationError
from tasks.judge.coco_resample import map_from_records, match_records
from tasks.prepare.losses.keypoints import gaussian_targets
from tasks.recipe.keypoints import OKS_METRICS, KeypointsSpec, keypoint_names, oks_sigmas


def check_keypoint_pair(out: np.ndarray, labels: np.ndarray, count: int) -> str:
    """ "heatmaps" or "coordinates" when ``out`` fits labels ``[N, K, 3]``; else an EvaluationError."""
    if labels.ndim != 3 or labels.shape[1:] != (count, 3):
        raise EvaluationError(
            f"keypoints: the test set's y has shape {list(labels.shape)}, expected [N, {count}, 3]"
        )
    if (
        len(out) != len(labels)
        or out.ndim not in (3, 4)
        or out.shape[1] != count
        or (out.ndim == 3 and out.shape[2] != 2)
    ):
        raise EvaluationError(
            f"keypoints: the model's output has shape {list(out.shape)}, expected heatmaps [{len(labels)}, "
            f"{count}, H, W] or coordinates [{len(labels)}, {count}, 2]"
        )  # fmt: skip
    return "heatmaps" if out.ndim == 4 else "coordinates"


def coco_keypoints_eval(pred: np.ndarray, scores: np.ndarray, labels: np.ndarray,
                        sigmas: tuple[float, ...]) -> Any:  # fmt: skip
    """pycocotools' evaluated, accumulated ``COCOeval(iouType="keypoints")`` of one predicted instance
    per image (``pred`` ``[N, K, 2]``, instance ``scores`` ``[N]``) against ``labels`` ``[N, K, 3]``."""
    from pycocotools.coco import COCO  # pycocotools only when keypoints are judged
    from pycocotools.cocoeval import COCOeval

    box = boxes(labels)
    annotations = []
    for i, kp in enumerate(labels):
        count = int((kp[:, 2] > 0).sum())
        area = max(box[i, 2], MIN_SIDE) * max(box[i, 3], MIN_SIDE)
        annotations.append({"id": i + 1, "image_id": i, "category_id": 1, "iscrowd": 0, "num_keypoints": count,
                            "keypoints": kp.astype(np.float64).ravel().tolist(), "bbox": box[i].tolist(),
                            "area": float(area) if count else 0.0})  # fmt: skip
    results = [
        {"image_id": i, "category_id": 1, "score": float(s),
         "keypoints": np.concatenate([p, np.ones((len(p), 1))], axis=1).ravel().tolist()}
        for i, (p, s) in enumerate(zip(pred, scores, strict=True))
    ]  # fmt: skip
    gt = COCO()
    gt.dataset = {
        "images": [{"id": i} for i in range(len(labels))],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "instance", "keypoints": [str(k) for k in range(labels.shape[1])]}],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(results), "keypoints")
        ev.params.kpt_oks_sigmas = np.asarray(sigmas, np.float64)
        ev.evaluate()
        ev.accumulate()
    return ev


def keypoint_records(ev: Any) -> dict[str, Any]:
    """The per-image COCO matches of an evaluated COCOeval, tied instance scores grouped."""
    return {**match_records(ev), "ties": "grouped"}


def oks_aps(records: dict[str, Any]) -> dict[str, float]:
    """``oks_ap`` (OKS .50:.95), ``oks_ap50``, ``oks_ap75`` of :func:`keypoint_records` (area "all",
    the last maxDets: what ``summarize()`` prints first, ties grouped); 0 where nothing counts."""
    ones = np.ones((1, records["images"]))
    return {
        name: round(float(map_from_records(records, ones, metric)[metric][0]), 6)
        for name, metric in OKS_METRICS.items()
    }


def keypoint_metrics(out: np.ndarray, labels: np.ndarray, spec: KeypointsSpec,
                     input_hw: tuple[int, int]) -> dict[str, Any]:  # fmt: skip
    """OKS AP (pycocotools), PCK, per-keypoint PCK and error, a few images' predicted keypoints
    (``examples``) and the per-image COCO matches and PCK (``per_sample``) of ``out`` against ``labels``."""
    kind = check_keypoint_pair(out, labels, spec.count)
    pred, peak = decode(out, input_hw, spec.subpixel)
    records = keypoint_records(coco_keypoints_eval(pred, peak.mean(axis=1), labels, oks_sigmas(spec)))
    labelled = labels[..., 2] > 0
    if not labelled.any():
        raise EvaluationError("keypoints test set: no labelled keypoint (every visibility is 0)")
    hit, dist = pck_hits(pred, labels, spec.pck_threshold)
    images = labelled.any(axis=1)
    per_image = (hit & labelled).sum(axis=1)[images] / labelled.sum(axis=1)[images]
    names = keypoint_names(spec)
    per_keypoint = {}
    for k, name in enumerate(names):
        seen = labelled[:, k]
        per_keypoint[name] = None if not seen.any() else {
            "pck": round(float(hit[seen, k].mean()), 6), "error_px": round(float(dist[seen, k].mean()), 4)}  # fmt: skip
    shown = np.flatnonzero(images)[: spec.examples]
    return {
        **oks_aps(records),
        "pck": round(float(per_image.mean()), 6),
        "per_keypoint": per_keypoint,
        "keypoint_names": list(names),
        "output": kind,
        "examples": [{"index": int(i), "keypoints": pred[i].round(3).tolist()} for i in shown],
        "per_sample": {"keypoints": records, "pck": per_image.round(6).tolist()},
    }


def keypoint_losses(out: np.ndarray, labels: np.ndarray, input_hw: tuple[int, int],
                    heatmap_sigma: float) -> tuple[float, np.ndarray]:  # fmt: skip
    """The training graph's keypoints MSE (:mod:`tasks.prepare.losses.keypoints`) of the whole test set
    and of each image: against Gaussian targets for heatmaps, of the labelled coordinates otherwise."""
    check_keypoint_pair(out, labels, labels.shape[1])
    weight = (labels[..., 2] > 0).astype(np.float64)
    if out.ndim == 3:
        err = ((out.astype(np.float64) - labels[..., :2]) ** 2).sum(axis=-1) * weight
        per_image = err.mean(axis=1)
    else:
        target, w = gaussian_targets(labels, out.shape[-2:], input_hw, heatmap_sigma)
        per_image = (((out.astype(np.float64) - target) ** 2) * w).mean(axis=(1, 2, 3))
    return float(per_image.mean()), per_image
