"""Segmentation metrics on the host: mIoU, per-class IoU and pixel accuracy agree with scikit-learn's
own scores, a resample's figures are those of its duplicated image list, and the paired bootstrap
over images tells a real gain from none and a background-only model from a better one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sklearn.metrics import accuracy_score, jaccard_score

from tasks.judge.decision import decide, headline
from tasks.judge.segmentation import class_iou, mean_iou, pixel_accuracy, segmentation_metrics
from tasks.judge.segmentation_resample import paired_iou_bootstrap
from tasks.recipe.extras import PromotionSpec

IGNORE = 255


def _scores(pred: np.ndarray, classes: int) -> np.ndarray:
    """Class scores [N, C, H, W] whose argmax is ``pred``."""
    return np.eye(classes, dtype=np.float32)[pred].transpose(0, 3, 1, 2)


def _masks(seed: int, n: int, classes: int, side: int = 6, ignored: float = 0.1):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, (n, side, side))
    y[rng.uniform(size=y.shape) < ignored] = IGNORE
    return y


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 5), classes=st.integers(2, 5), ignored=st.floats(0, 1),
       absent=st.booleans())  # fmt: skip
@example(seed=0, n=1, classes=3, ignored=0.0, absent=True)  # a class in neither truth nor prediction
@example(seed=0, n=2, classes=2, ignored=1.0, absent=False)  # every pixel ignored
def test_metrics_equal_scikit_learn_on_the_pixels_not_ignored(seed, n, classes, ignored, absent):
    y = _masks(seed, n, classes, ignored=ignored)
    rng = np.random.default_rng(seed + 1)
    pred = np.where(
        rng.uniform(size=y.shape) < 0.6, np.where(y == IGNORE, 0, y), rng.integers(0, classes, y.shape)
    )
    if absent:  # the last class in neither the truth nor the prediction
        y[y == classes - 1], pred[pred == classes - 1] = 0, 0
    m = segmentation_metrics(_scores(pred, classes), y, [f"c{k}" for k in range(classes)], IGNORE)
    kept = y != IGNORE
    t, p = y[kept], pred[kept]
    present = sorted(set(t.tolist()) | set(p.tolist()))
    if not present:
        assert m["miou"] == 0.0 and m["pixel_accuracy"] == 0.0
        return
    want = jaccard_score(t, p, labels=present, average=None, zero_division=0)
    assert m["miou"] == pytest.approx(float(np.mean(want)))
    assert m["pixel_accuracy"] == pytest.approx(accuracy_score(t, p))
    for k in range(classes):
        got = m["per_class_iou"][f"c{k}"]
        assert got is None if k not in present else got == pytest.approx(want[present.index(k)], abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_a_resample_is_the_metric_of_its_duplicated_image_list(seed):
    classes, y = 4, _masks(seed, 8, 4)
    rng = np.random.default_rng(seed)
    pred = np.where(rng.uniform(size=y.shape) < 0.7, np.where(y == IGNORE, 0, y), 0)
    per_image = np.asarray(segmentation_metrics(_scores(pred, classes), y, list("abcd"), IGNORE)
                           ["per_sample"]["segmentation"]["confusion"])  # fmt: skip
    draw = rng.integers(0, 8, 8)
    summed = per_image[draw].sum(axis=0)
    whole = segmentation_metrics(_scores(pred[draw], classes), y[draw], list("abcd"), IGNORE)
    assert float(mean_iou(class_iou(summed))) == pytest.approx(whole["miou"])
    assert float(pixel_accuracy(summed)) == pytest.approx(whole["pixel_accuracy"])


def _metrics(pred: np.ndarray, y: np.ndarray, classes: int = 4) -> dict:
    return segmentation_metrics(_scores(pred, classes), y, ["background", "a", "b", "c"], IGNORE)


def _scene(seed: int, n: int = 40, side: int = 12):
    """Masks with a background and one object of a class per image, and three predictions: the truth
    with a few errors (good), wrong objects over most pixels (poor), and background everywhere."""
    rng = np.random.default_rng(seed)
    y = np.zeros((n, side, side), np.int64)
    for i in range(n):
        x0, y0 = rng.integers(0, side // 2, 2)
        y[i, y0 : y0 + side // 2, x0 : x0 + side // 2] = rng.integers(1, 4)
    good = np.where(rng.uniform(size=y.shape) < 0.9, y, rng.integers(0, 4, y.shape))
    poor = np.where(rng.uniform(size=y.shape) < 0.1, y, rng.integers(1, 4, y.shape))  # objects everywhere
    return y, good, poor, np.zeros_like(y)


def test_the_bootstrap_finds_a_real_gain_and_none_between_equal_models():
    y, good, poor, _ = _scene(0)
    g, p = _metrics(good, y), _metrics(poor, y)
    out = paired_iou_bootstrap(g["per_sample"]["segmentation"], p["per_sample"]["segmentation"], "miou", 0.95,
                               class_names=g["classes"])  # fmt: skip
    assert (
        out["gain"] == pytest.approx(g["miou"] - p["miou"]) and 0 < out["low"] <= out["gain"] <= out["high"]
    )
    assert out["objects"]["low"] > 0 and set(out["per_class"]) == set(g["classes"])
    same = paired_iou_bootstrap(
        g["per_sample"]["segmentation"], g["per_sample"]["segmentation"], "miou", 0.95
    )
    assert same["low"] == same["high"] == same["gain"] == 0.0


def test_a_background_only_candidate_is_refused_with_its_miou_interval():
    """The issue's case: over a reference that is worse than predicting background everywhere, a
    background-only model gains mIoU significantly, yet no object class: it is not promoted, and the
    refusal gives the mIoU gain's interval and the object classes' figures."""
    y, _, poor, background = _scene(1)
    cand, ref = _metrics(background, y), _metrics(poor, y)
    assert cand["miou"] > ref["miou"] and cand["predicted_background"] == 1.0
    d = decide(cand, ref, PromotionSpec(metric="miou"), "base")
    assert not d.promote
    sig = next(c for c in d.checks if c["kind"] == "significance")
    objects = next(c for c in d.checks if c["kind"] == "objects")
    assert sig["holds"] and not objects["holds"]  # the mIoU gain itself is significant
    assert f"[{d.significance['low']:+.4f}, {d.significance['high']:+.4f}]" in objects["text"]
    assert "predicts background on 100.0% of the test pixels" in objects["text"]
    assert "fails: no gain on the object classes" in headline(d)
    off = decide(cand, ref, PromotionSpec(metric="miou", significance="off"), "base")
    assert not off.promote  # untested, yet still refused: its object classes do not rise


def test_a_better_model_is_promoted_on_miou():
    y, good, poor, _ = _scene(2)
    d = decide(_metrics(good, y), _metrics(poor, y), PromotionSpec(metric="miou"), "base")
    assert d.promote, d.reason
    assert [c["kind"] for c in d.checks] == ["min_gain", "significance", "objects", "class", "class", "class"]
    assert [c["name"] for c in d.checks[3:]] == ["class a", "class b", "class c"]


def test_a_class_the_candidate_does_not_find_is_refused_whatever_the_mean():
    """The issue's case: mIoU 0.08 -> 0.63 promoted a model with one object class at IoU 0.003. Each
    object class is guarded on its own: under min_class_iou, or fallen beyond class_tolerance."""
    y, good, poor, _ = _scene(2)
    lost = np.where(y == 3, 0, good)  # class c's pixels predicted as background
    cand, ref = _metrics(lost, y), _metrics(poor, y)
    assert cand["object_miou"] > ref["object_miou"] + 0.2 and cand["per_class_iou"]["c"] < 0.05
    d = decide(cand, ref, PromotionSpec(metric="miou"), "base")
    assert not d.promote and [c["name"] for c in d.failing()] == ["class c"], d.reason
    assert "under 0.05: the candidate does not find c" in d.reason and "class c IoU 0.000" in headline(d)
    off = PromotionSpec(metric="miou", min_class_iou="off", class_tolerance="off")
    assert decide(cand, ref, off, "base").promote  # the object mean alone would have promoted it
    # against a reference that finds c, the candidate's loss of c is a drop beyond the tolerance
    d = decide(
        cand,
        _metrics(good, y),
        PromotionSpec(metric="miou", min_class_iou="off", significance="off", min_gain=-1),
        "v0001",
    )
    c = next(c for c in d.checks if c["name"] == "class c")
    assert not c["holds"] and "beyond its tolerance 0.02" in c["text"]
