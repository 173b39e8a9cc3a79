"""The image-level decomposition of COCO mAP equals pycocotools on the full set and on resamples
(image lists with repeats), and the paired bootstrap over images tells a real detection gain
from noise."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import EvaluationError
from tasks.judge.coco_resample import map_from_records, paired_map_bootstrap
from tasks.judge.detection import coco_eval

CLASSES = ("square", "disc", "triangle", "star")  # "star" never occurs in the ground truth


def _scene(seed: int, images: int = 12, ties: bool = False):
    """Random ground truth (0-3 boxes per image of the first three classes) and detections: jittered
    copies of the truth (some with the wrong class) plus random false positives."""
    rng = np.random.default_rng(seed)
    gt_boxes = np.zeros((images, 3, 4), np.float32)
    gt_labels = np.full((images, 3), -1, np.int64)
    found = []
    for i in range(images):
        m = int(rng.integers(0, 4))
        xy = rng.uniform(0, 0.6, (m, 2))
        wh = rng.uniform(0.1, 0.35, (m, 2))
        gt_boxes[i, :m] = np.concatenate([xy, xy + wh], 1)
        gt_labels[i, :m] = rng.integers(0, 3, m)
        jitter = gt_boxes[i, :m] + rng.normal(0, 0.04, (m, 4))
        labels = np.where(rng.uniform(size=m) < 0.2, rng.integers(0, 4, m), gt_labels[i, :m])
        k = int(rng.integers(0, 5))
        fxy = rng.uniform(0, 0.7, (k, 2))
        fp = np.concatenate([fxy, fxy + rng.uniform(0.05, 0.3, (k, 2))], 1)
        boxes = np.concatenate([jitter, fp]).astype(np.float32)
        scores = rng.uniform(0.05, 1.0, m + k)
        if ties:
            scores = np.round(scores, 1)
        found.append((boxes, np.concatenate([labels, rng.integers(0, 4, k)]), scores.astype(np.float32)))
    return found, gt_boxes, gt_labels


def _coco(found, gt_boxes, gt_labels):
    return coco_eval(found, gt_boxes, gt_labels, CLASSES, (96, 96))


@pytest.mark.parametrize("seed", range(6))
def test_the_full_set_equals_pycocotools(seed):
    m = _coco(*_scene(seed, ties=seed % 2 == 1))
    for metric in ("map", "map50", "map75"):
        got = map_from_records(m["matches"], np.ones((1, 12)), metric)
        assert got[metric][0] == pytest.approx(m[metric], abs=1e-6)  # pycocotools rounds to 6 digits
    per_class = map_from_records(m["matches"], np.ones((1, 12)), "map50")["per_class"][0]
    for k, name in enumerate(CLASSES):
        want = m["per_class_ap50"][name]
        assert np.isnan(per_class[k]) if want is None else per_class[k] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_a_resample_equals_pycocotools_on_the_duplicated_image_list(seed):
    found, gt_boxes, gt_labels = _scene(seed + 10)
    rng = np.random.default_rng(seed)
    draw = np.sort(rng.integers(0, 12, 12))  # image order kept: pycocotools breaks score ties by image
    counts = np.bincount(draw, minlength=12)[None].astype(float)
    full = _coco(found, gt_boxes, gt_labels)["matches"]
    dup = _coco([found[i] for i in draw], gt_boxes[draw], gt_labels[draw])
    for metric in ("map", "map50", "map75"):
        assert map_from_records(full, counts, metric)[metric][0] == pytest.approx(dup[metric], abs=1e-6)


def test_nothing_detected_scores_zero_on_every_resample():
    found, gt_boxes, gt_labels = _scene(3)
    empty = [(np.zeros((0, 4), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32))] * 12
    m = _coco(empty, gt_boxes, gt_labels)
    assert m["map50"] == 0.0
    assert (map_from_records(m["matches"], np.ones((3, 12)), "map50")["map50"] == 0.0).all()


def test_the_bootstrap_tells_a_real_gain_from_noise():
    found, gt_boxes, gt_labels = _scene(7, images=40)
    good = _coco(found, gt_boxes, gt_labels)["matches"]
    same = paired_map_bootstrap(good, good, "map50", 0.95, resamples=300)
    assert same["low"] == same["high"] == same["gain"] == 0.0
    rng = np.random.default_rng(1)
    missed = [(b + rng.normal(0, 0.2, b.shape).astype(np.float32), lab, s) for b, lab, s in found]
    bad = _coco(missed, gt_boxes, gt_labels)["matches"]
    real = paired_map_bootstrap(good, bad, "map50", 0.95, resamples=300, class_names=list(CLASSES))
    assert real["gain"] > 0.1 and real["low"] > 0 and set(real["per_class"]) == {"square", "disc", "triangle"}
    # the same detector with a few scores perturbed: a gain or loss of noise, not significant
    noisy = [
        (b, lab, np.clip(s + rng.normal(0, 0.05, s.shape), 0, 1).astype(np.float32)) for b, lab, s in found
    ]
    n = paired_map_bootstrap(_coco(noisy, gt_boxes, gt_labels)["matches"], good, "map50", 0.95, resamples=300)
    assert n["low"] <= 0 <= n["high"]
    with pytest.raises(EvaluationError, match="evaluated on 40 images and 4 classes, the reference on 12"):
        paired_map_bootstrap(good, _coco(*_scene(3))["matches"], "map50", 0.95)


@pytest.mark.parametrize("max_detections", [50, 100, 200])
def test_map_is_reported_for_any_max_detections(max_detections):
    """pycocotools' summarize() reads mAP@[.5:.95] at maxDets == 100 only; the host's figures come
    from the precision at the recipe's own max_detections, as the bootstrap's records do."""
    found, gt_boxes, gt_labels = _scene(2)
    m = coco_eval(found, gt_boxes, gt_labels, CLASSES, (96, 96), max_detections)
    assert m["map"] > 0
    for metric in ("map", "map50", "map75"):
        got = map_from_records(m["matches"], np.ones((1, 12)), metric)[metric][0]
        assert got == pytest.approx(m[metric], abs=1e-6)
