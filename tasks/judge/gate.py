"""The promotion gate's statistics: is the candidate's gain real, and does anything regress?

A gain on a test set of a few hundred samples can be two samples. Before the promotion rule's
``min_gain`` is even looked at, the gain must be significant on the paired test set:

* accuracy (classification, binary): McNemar's exact test on the samples the two models disagree
  on - of those, how many the candidate gets right - one-sided, by ``scipy.stats.binomtest``;
* a loss of any kind (built-in from the outputs; custom and embedded from the eval graph run one
  sample at a time), mse and mae: a paired bootstrap confidence interval of the mean per-sample
  improvement (``scipy.stats.bootstrap``, percentile method, seeded); significant when the whole
  interval lies on the better side of zero;
* mAP, mAP@0.5, mAP@0.75 of a detector: a paired bootstrap over test images (the same resamples
  for both models, mAP recomputed exactly from each image's matches, :mod:`tasks.judge.coco_resample`);
* mIoU and pixel accuracy of a segmentation: a paired bootstrap over test images (both models' metrics
  recomputed from the summed confusion matrices of each resample, :mod:`tasks.judge.segmentation_resample`),
  and on the same resamples the object classes' mIoU, whose gain must be significant too
  (:func:`objects_check`: a model that learns only the background is never promoted), and each
  object class is guarded on its own (:func:`class_checks`: the mean may rise while a class is lost);
* OKS AP of keypoints (``oks_ap``, ``oks_ap50``, ``oks_ap75``): the detector's bootstrap over test
  images on pycocotools' keypoint matches (:mod:`tasks.judge.keypoints`); PCK: the paired bootstrap
  of the per-image PCK.

A metric without a per-sample form is not significant: the gate refuses to promote on it unless the
recipe sets ``significance = "off"`` (then the decision says it was not tested). Guardrails then
compare other metrics and test sets (``"loss"``, ``"clean.accuracy"``): each may regress by at most
its tolerance (absolute, in the metric's units).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.errors import RegistryError
from tasks.judge.coco_resample import METRIC_THRESHOLDS, paired_map_bootstrap
from tasks.judge.direction import LOWER_IS_BETTER
from tasks.judge.segmentation_resample import paired_iou_bootstrap
from tasks.recipe.keypoints import OKS_METRICS
from tasks.recipe.segmentation import SEGMENTATION_METRICS

BOOTSTRAP_RESAMPLES = 2000


def mcnemar(candidate_correct: list[int], reference_correct: list[int]) -> dict[str, Any]:
    """One-sided exact McNemar test that the candidate is right more often than the reference."""
    from scipy.stats import binomtest  # scipy (heavy) only when a gate runs a test

    c, r = np.asarray(candidate_correct, bool), np.asarray(reference_correct, bool)
    if c.shape != r.shape:
        raise RegistryError(f"significance: {len(c)} candidate samples vs {len(r)} reference samples")
    wins, losses = int((c & ~r).sum()), int((~c & r).sum())
    p = float(binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue) if wins + losses else 1.0
    return {
        "test": "McNemar exact (one-sided)",
        "candidate_only_right": wins,
        "reference_only_right": losses,
        "p_value": p,
    }


def paired_bootstrap(
    candidate: list[float], reference: list[float], lower_is_better: bool, confidence: float, seed: int = 0
) -> dict[str, Any]:
    """Confidence interval of the mean per-sample improvement (positive = the candidate is better)."""
    from scipy.stats import bootstrap  # scipy (heavy) only when a gate runs a test

    c, r = np.asarray(candidate, np.float64), np.asarray(reference, np.float64)
    if c.shape != r.shape:
        raise RegistryError(f"significance: {len(c)} candidate samples vs {len(r)} reference samples")
    gain = r - c if lower_is_better else c - r
    if np.ptp(gain) == 0:  # every sample improves by the same amount: no spread to resample
        low = high = float(gain[0]) if len(gain) else 0.0
    else:
        res = bootstrap((gain,), np.mean, confidence_level=confidence, n_resamples=BOOTSTRAP_RESAMPLES,
                        method="percentile", random_state=np.random.default_rng(seed))  # fmt: skip
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return {"test": f"paired bootstrap, {confidence:.0%} CI of the mean gain", "low": low, "high": high}


def significance(
    metric: str, candidate: dict[str, Any], reference: dict[str, Any], alpha: float
) -> dict[str, Any]:
    """The test of ``metric``'s gain: its name, figures, ``significant`` and a sentence."""
    cand, ref = candidate.get("per_sample") or {}, reference.get("per_sample") or {}
    if metric == "accuracy" and "correct" in cand and "correct" in ref:
        out = mcnemar(cand["correct"], ref["correct"])
        out["significant"] = out["p_value"] < alpha
        wins, losses = out["candidate_only_right"], out["reference_only_right"]
        out["figures"] = f"p = {out['p_value']:.3g} (right alone: {wins} vs {losses})"
        out["reason"] = (
            f"McNemar: the candidate alone is right on {out['candidate_only_right']} test samples, "
            f"the reference alone on {out['reference_only_right']}: p = {out['p_value']:.3g} "
            f"{'<' if out['significant'] else '>='} {alpha:g}"
        )
        return out
    if metric in METRIC_THRESHOLDS and "detection" in cand and "detection" in ref:
        out = paired_map_bootstrap(
            cand["detection"], ref["detection"], metric, 1.0 - alpha, class_names=candidate.get("classes")
        )
        return _over_images(out, metric, cand["detection"]["images"], alpha)
    if metric in OKS_METRICS and "keypoints" in cand and "keypoints" in ref:  # OKS's matches, as a detector's
        out = paired_map_bootstrap(cand["keypoints"], ref["keypoints"], OKS_METRICS[metric], 1.0 - alpha)
        out.pop("per_class")  # one category: the instance
        return _over_images(out, metric, cand["keypoints"]["images"], alpha)
    if metric in SEGMENTATION_METRICS and "segmentation" in cand and "segmentation" in ref:
        return segmentation_significance(metric, candidate, reference, alpha)
    same_loss = metric != "loss" or candidate.get("loss_kind") == reference.get("loss_kind")
    if metric in cand and metric in ref and same_loss:
        out = paired_bootstrap(cand[metric], ref[metric], metric in LOWER_IS_BETTER, 1.0 - alpha)
        out["significant"] = out["low"] > 0
        out["figures"] = _interval(f"mean {metric} gain", out["low"], out["high"], 1 - alpha)
        out["reason"] = (
            f"paired bootstrap: the mean per-sample {metric} gain lies in [{out['low']:+.4g}, {out['high']:+.4g}] "
            f"({1 - alpha:.0%})" + ("" if out["significant"] else ", which includes no gain")
        )
        return out
    return {
        "test": "none",
        "significant": False,
        "figures": f"no per-sample {metric} figures",
        "reason": f"no per-sample figures of {metric} to test its gain on, so it is not promoted on "
        '(set [promotion] significance = "off" to judge it on min_gain alone, untested)',
    }


def segmentation_significance(
    metric: str, candidate: dict[str, Any], reference: dict[str, Any], alpha: float
) -> dict[str, Any]:
    """The paired bootstrap over test images of a segmentation metric's gain (and, on the same
    resamples, of each class's IoU and of the object classes' mIoU: ``objects``)."""
    cand, ref = candidate["per_sample"]["segmentation"], reference["per_sample"]["segmentation"]
    out = paired_iou_bootstrap(cand, ref, metric, 1.0 - alpha, class_names=candidate.get("classes"))
    return _over_images(out, metric, len(cand["confusion"]), alpha)


def _over_images(out: dict[str, Any], metric: str, images: int, alpha: float) -> dict[str, Any]:
    """A bootstrap over test images (``low``, ``high``, ``gain``) with its verdict, cell and sentence."""
    out["significant"] = out["low"] > 0
    out["figures"] = _interval(f"{metric} gain", out["low"], out["high"], 1 - alpha)
    out["reason"] = (
        f"paired bootstrap over {images} test images: the {metric} gain {out['gain']:+.4f} "
        f"lies in [{out['low']:+.4f}, {out['high']:+.4f}] ({1 - alpha:.0%})"
        + ("" if out["significant"] else ", which includes no gain")
    )
    return out


def objects_check(
    candidate: dict[str, Any], reference: dict[str, Any], test: dict[str, Any] | None, alpha: float | None
) -> dict[str, Any] | None:
    """The gate's check that a segmentation gain reaches the object classes: their mIoU (every class
    but the background) must rise significantly too (with ``significance = "off"`` at least rise), so a
    model that learns only the background is never promoted; None without per-image figures."""
    if test is None or "objects" not in test:
        cand, ref = candidate.get("per_sample") or {}, reference.get("per_sample") or {}
        if "segmentation" not in cand or "segmentation" not in ref:
            return None
        test = segmentation_significance("miou", candidate, reference, alpha or 0.05)
    objects = test.get("objects")
    if objects is None:
        return None
    holds = objects["low"] > 0 if alpha is not None else objects["gain"] > 0
    share = (
        f"; it predicts {objects['background']} on {objects['predicted_background']:.1%} of the test pixels"
    )
    return {
        "kind": "objects", "name": "object classes", "holds": holds,
        "short": "no gain on the object classes",
        "figures": _interval("object mIoU gain", objects["low"], objects["high"], 1 - (alpha or 0.05)),
        "text": f"the mIoU of the classes other than {objects['background']} goes {objects['reference']:.4f} -> "
                f"{objects['candidate']:.4f}, gain {objects['gain']:+.4f} in [{objects['low']:+.4f}, "
                f"{objects['high']:+.4f}] on the same resamples"
                + ("" if holds else f": no {'significant ' if alpha else ''}gain on the object classes{share}, "
                   f"while {test['reason']}"),
    }  # fmt: skip


def class_checks(
    candidate: dict[str, Any], reference: dict[str, Any], tolerance: float | None, floor: float | None
) -> list[dict[str, Any]]:
    """A segmentation's object classes guarded one by one (the object mean can rise while one class is
    lost): each class's IoU may fall at most ``tolerance`` below the reference's and may not stay
    under ``floor`` (the candidate does not find the class). None of either: that part is off."""
    cand, ref = candidate.get("per_class_iou"), reference.get("per_class_iou")
    if not isinstance(cand, dict) or not isinstance(ref, dict) or (tolerance is None and floor is None):
        return []
    names = list(candidate.get("classes") or cand)
    background = int(candidate.get("background", -1))
    out = []
    for i, name in enumerate(names):
        c, r = cand.get(name), ref.get(name)
        if i == background or c is None:  # the background, or a class in neither truth nor prediction
            continue
        drop = (r - c) if r is not None else 0.0
        lost = tolerance is not None and drop > tolerance
        unfound = floor is not None and c < floor
        why = [f"falls {drop:.4f}, beyond its tolerance {tolerance:g}"] if lost else []
        why += [f"under {floor:g}: the candidate does not find {name}"] if unfound else []
        was = "-" if r is None else f"{r:.4f}"
        out.append({
            "kind": "class", "name": f"class {name}", "holds": not why, "drop": drop > 0,
            "short": f"class {name} IoU {c:.3f}",
            "figures": f"IoU {was} -> {c:.4f}" + (f" (tol. {tolerance:g})" if tolerance is not None else ""),
            "text": f"the IoU of {name} goes {was} -> {c:.4f}" + (": " + "; ".join(why) if why else
                    (f", within its tolerance {tolerance:g}" if tolerance is not None else "")),
        })  # fmt: skip
    return out


def guardrails(
    rules: dict[str, float],
    candidate: dict[str, dict[str, Any]],
    reference: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each rule ``"[set.]metric" = tolerance`` checked on the candidate vs the reference.

    ``candidate`` and ``reference`` map test-set names ("test", "clean", ...) to metrics. A rule
    naming a set or metric the evaluation does not have is an error, not a pass.
    """
    out = []
    for rule, tolerance in rules.items():
        test_set, _, metric = rule.rpartition(".")
        test_set = test_set or "test"
        if test_set not in candidate or test_set not in reference:
            raise RegistryError(
                f"promotion.guardrails '{rule}': no test set '{test_set}' (have {sorted(candidate)})"
            )
        c, r = candidate[test_set].get(metric), reference[test_set].get(metric)
        if not isinstance(c, (int, float)) or not isinstance(r, (int, float)):
            numbers = sorted(k for k, v in candidate[test_set].items() if isinstance(v, (int, float)))
            raise RegistryError(f"promotion.guardrails '{rule}': no metric '{metric}' (have {numbers})")
        regression = (c - r) if metric in LOWER_IS_BETTER else (r - c)
        holds = regression <= tolerance
        out.append({
            "rule": rule, "candidate": float(c), "reference": float(r), "regression": float(regression),
            "tolerance": float(tolerance), "holds": holds,
            "figures": f"{r:.4f} -> {c:.4f}, " + (f"drop {regression:.4f}" if regression > 0 else "no drop")
                       + f" (tol. {tolerance:g})",
            "reason": f"{rule} {r:.4f} -> {c:.4f}: "
                      + (f"regresses by {regression:.4f}" if regression > 0 else "no regression")
                      + f" ({'within' if holds else 'beyond'} its tolerance {tolerance:g})",
        })  # fmt: skip
    return out


def _interval(what: str, low: float, high: float, confidence: float) -> str:
    """A confidence interval in a table cell: "mean loss gain [-0.01, +0.02] (95%)"."""
    return f"{what} [{low:+.4g}, {high:+.4g}] ({confidence:.0%})"
