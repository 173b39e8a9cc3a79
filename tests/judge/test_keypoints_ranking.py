"""How keypoint instances rank for OKS AP: coordinate outputs carry no confidence (every instance
scores 1), so their ties form one block: the AP is that of a model that ranks nothing, the same
whatever the test images' order (pycocotools' own accumulation orders ties by image, so the AP moved
with the order); heatmap instances keep their peaks' order, where the AP is pycocotools' own."""

from __future__ import annotations

import numpy as np
import pytest

from device_agent.keypoints import decode
from tasks.judge.coco_resample import RECALL_POINTS, map_from_records, match_records
from tasks.judge.keypoints import coco_keypoints_eval, keypoint_metrics
from tasks.prepare.losses.keypoints import gaussian_targets
from tasks.recipe.keypoints import DEFAULT_SIGMA, KeypointsSpec

N, K = 10, 4
SPEC = KeypointsSpec(count=K)


def _labels(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = np.zeros((N, K, 3), np.float32)
    y[..., :2] = rng.uniform(4, 28, (N, K, 2))
    y[..., 2] = 2
    return y


def _half_right(y: np.ndarray) -> np.ndarray:
    """Coordinates right on images 0, 2, 4, 6 (4 of 10), far off on the others."""
    pred = y[..., :2].copy()
    pred[[1, 3, 5, 7, 8, 9]] += 12.0
    return pred


def test_coordinate_instances_tie_as_one_block_whatever_the_image_order():
    y = _labels()
    pred = _half_right(y)
    m = keypoint_metrics(pred, y, SPEC, (32, 32))
    share = 0.4  # precision = recall = 4 / 10 at every OKS threshold, for the block as a whole
    closed = share * float(np.mean(RECALL_POINTS <= share + 1e-12))
    assert m["oks_ap"] == m["oks_ap50"] == m["oks_ap75"] == pytest.approx(closed, abs=1e-6)
    for seed in range(3):  # the right images first, last or anywhere: the same AP
        order = np.random.default_rng(seed).permutation(N)
        assert keypoint_metrics(pred[order], y[order], SPEC, (32, 32))["oks_ap"] == m["oks_ap"]
    right_first = np.argsort([i % 2 == 1 or i > 7 for i in range(N)], kind="stable")
    ungrouped = match_records(
        coco_keypoints_eval(pred[right_first], np.ones(N), y[right_first], (DEFAULT_SIGMA,) * K)
    )
    by_image = map_from_records(ungrouped, np.ones((1, N)), "map")["map"][0]
    assert by_image > m["oks_ap"] + 0.2  # what ordering ties by image gave: the right images first win


def test_heatmap_instances_rank_by_their_peaks_as_pycocotools_does():
    y = _labels(1)
    amplitude = np.random.default_rng(2).uniform(0.3, 1.0, N)
    shifted = y.copy()
    shifted[::3, :, :2] += 3.0  # some images a few pixels off
    heat = gaussian_targets(shifted, (32, 32), (32, 32), 1.0)[0] * amplitude[:, None, None, None]
    m = keypoint_metrics(heat.astype(np.float32), y, SPEC, (32, 32))
    pred, peak = decode(heat, (32, 32), True)
    ev = coco_keypoints_eval(pred, peak.mean(axis=1), y, (DEFAULT_SIGMA,) * K)
    precision = ev.eval["precision"][:, :, 0, 0, -1]
    assert 0 < m["oks_ap"] < 1 and m["oks_ap"] == pytest.approx(float(precision.mean()), abs=1e-6)
