"""Semantic segmentation on the host: mIoU, per-class IoU and pixel accuracy of a model's class
scores ``[N, C, H, W]`` against masks ``[N, H, W]``.

Each test image's confusion matrix comes from scikit-learn (``sklearn.metrics.confusion_matrix``
over the pixels that are not ``ignore_index``); the metrics are computed from their sum, as
mmsegmentation and torchmetrics' ``JaccardIndex`` do: ``IoU_c = TP / (TP + FP + FN)``, a class that
neither the truth nor the prediction holds has no IoU and is left out of the mean. The per-image
matrices stay in the metrics (``per_sample["segmentation"]``) for the promotion gate's paired
bootstrap over images (:mod:`tasks.judge.segmentation_resample`), and a few images' predicted masks
(``examples``) for the report.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.errors import EvaluationError
from tasks.judge.segmentation_losses import check_pair

EXAMPLE_SIDE = 96  # the report's masks are stored at most this many pixels a side


def image_confusions(pred: np.ndarray, labels: np.ndarray, classes: int, ignore_index: int) -> np.ndarray:
    """``[N, C, C]`` int64: each image's counts ``[true, predicted]`` over the pixels not ignored."""
    from sklearn.metrics import confusion_matrix  # scikit-learn only when a segmentation is judged

    ids = list(range(classes))
    out = np.zeros((len(labels), classes, classes), np.int64)
    for i, (p, t) in enumerate(zip(pred, labels, strict=True)):
        kept = t != ignore_index
        if kept.any():
            out[i] = confusion_matrix(t[kept].ravel(), p[kept].ravel(), labels=ids)
    return out


def class_iou(cm: np.ndarray) -> np.ndarray:
    """IoU per class from confusion matrices ``[..., C, C]`` (NaN where a class has no pixel in
    either the truth or the prediction)."""
    tp = np.diagonal(cm, axis1=-2, axis2=-1).astype(np.float64)
    union = cm.sum(axis=-1) + cm.sum(axis=-2) - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, tp / union, np.nan)


def mean_iou(iou: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """The mean over the classes (last axis) that have an IoU; NaN when none has (``keep``: a mask
    of the classes to average)."""
    if keep is not None:
        iou = iou[..., keep]
    counted = (~np.isnan(iou)).sum(axis=-1)
    total = np.nansum(iou, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counted > 0, total / np.maximum(counted, 1), np.nan)


def pixel_accuracy(cm: np.ndarray) -> np.ndarray:
    """Correct pixels over counted pixels, from confusion matrices ``[..., C, C]``."""
    total = cm.sum(axis=(-2, -1)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, np.trace(cm, axis1=-2, axis2=-1) / np.maximum(total, 1), np.nan)


def object_classes(classes: int, background: int) -> np.ndarray:
    """A mask of the classes that are not the background (every class when ``background`` < 0)."""
    keep = np.ones(classes, bool)
    if 0 <= background < classes:
        keep[background] = False
    return keep


def segmentation_metrics(scores: np.ndarray, labels: np.ndarray, class_names: list[str] | tuple[str, ...],
                         ignore_index: int, background: int = 0, examples: int = 3) -> dict[str, Any]:  # fmt: skip
    """mIoU, pixel accuracy, per-class IoU, the object classes' mIoU, the summed confusion matrix,
    the per-image matrices (``per_sample``) and a few predicted masks (``examples``)."""
    check_pair(scores, labels)
    classes = scores.shape[1]
    if len(class_names) != classes:
        raise EvaluationError(
            f"segmentation: the model outputs {classes} classes, the recipe names {len(class_names)}"
        )
    pred = scores.argmax(axis=1)
    per_image = image_confusions(pred, labels, classes, ignore_index)
    cm = per_image.sum(axis=0)
    iou = class_iou(cm)
    objects = float(mean_iou(iou, object_classes(classes, background)))
    return {
        "miou": _number(mean_iou(iou)),
        "pixel_accuracy": _number(pixel_accuracy(cm)),
        "object_miou": _number(objects),
        "per_class_iou": {n: (None if np.isnan(v) else round(float(v), 6)) for n, v in zip(class_names, iou, strict=True)},
        "confusion_matrix": cm.tolist(),
        "classes": list(class_names),
        "background": background,
        "ignore_index": ignore_index,
        "predicted_background": _share(cm, background),
        "examples": example_masks(pred, labels, ignore_index, examples),
        "per_sample": {"segmentation": {"confusion": per_image.tolist(), "background": background}},
    }  # fmt: skip


def _number(value: Any) -> float:
    """A metric as a float (0.0 for NaN: no class had pixels, which a test set never is)."""
    v = float(value)
    return 0.0 if np.isnan(v) else v


def _share(cm: np.ndarray, cls: int) -> float | None:
    """The share of counted pixels predicted as ``cls`` (None without such a class)."""
    if not 0 <= cls < len(cm) or cm.sum() == 0:
        return None
    return round(float(cm[:, cls].sum() / cm.sum()), 6)


def example_masks(
    pred: np.ndarray, labels: np.ndarray, ignore_index: int, count: int
) -> list[dict[str, Any]]:
    """The predicted masks of the first ``count`` test images holding more than one class (nearest
    subsampling to at most EXAMPLE_SIDE pixels a side), as ``{"index", "mask"}``."""
    out = []
    for i, t in enumerate(labels):
        if len(out) >= count:
            break
        if len(np.unique(t[t != ignore_index])) > 1:
            out.append({"index": i, "mask": subsample(pred[i]).tolist()})
    return out


def subsample(mask: np.ndarray, side: int = EXAMPLE_SIDE) -> np.ndarray:
    """``mask`` ([H, W]) by nearest neighbours to at most ``side`` pixels a side."""
    step = max(1, -(-max(mask.shape[-2:]) // side))
    return mask[..., ::step, ::step]
