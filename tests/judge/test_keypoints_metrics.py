"""Keypoints on the host: OKS AP from pycocotools against hand-computed OKS and rankings, PCK, the
decoding of heatmaps, the gate's bootstrap over images, and bad labels refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from device_agent.keypoints import decode
from tasks.errors import DataError, EvaluationError
from tasks.judge.coco_resample import map_from_records
from tasks.judge.gate import significance
from tasks.judge.keypoints import keypoint_metrics
from tasks.prepare.losses.keypoints import gaussian_targets
from tasks.recipe.datafiles import check_keypoints
from tasks.recipe.keypoints import DEFAULT_SIGMA, KeypointsSpec

THRESHOLDS = np.linspace(0.5, 0.95, 10)


def _labels(n: int = 12, k: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = np.zeros((n, k, 3), np.float32)
    y[..., :2] = rng.uniform(4, 28, (n, k, 2))
    y[..., 2] = 2
    return y


def _heatmaps(y: np.ndarray, amplitude: np.ndarray | None = None) -> np.ndarray:
    heat = gaussian_targets(y, (32, 32), (32, 32), 1.0)[0]
    return (heat * (1.0 if amplitude is None else amplitude[:, None, None, None])).astype(np.float32)


def test_a_perfect_prediction_scores_one():
    y = _labels()
    m = keypoint_metrics(y[..., :2].copy(), y, KeypointsSpec(count=4), (32, 32))
    assert (m["oks_ap"], m["oks_ap50"], m["oks_ap75"], m["pck"]) == (1.0, 1.0, 1.0, 1.0)
    assert all(v["pck"] == 1.0 and v["error_px"] == 0.0 for v in m["per_keypoint"].values())


def test_oks_ap_of_one_instance_is_the_share_of_thresholds_its_hand_computed_oks_passes():
    """One image: OKS = mean_k exp(-d_k^2 / (2 s^2 (2 sigma)^2)), s^2 the labelled keypoints' box
    area (pycocotools' formula); AP at a threshold is 1 when OKS reaches it, else 0."""
    y = np.array([[[4.0, 6.0, 2], [20.0, 6.0, 2], [12.0, 26.0, 2]]], np.float32)
    pred = y[..., :2] + np.array([[[1.0, 0.0], [0.0, -2.0], [1.5, 1.5]]])
    area = 16.0 * 20.0
    d2 = ((pred - y[..., :2]) ** 2).sum(-1)[0]
    oks = float(np.mean(np.exp(-d2 / (2 * area * (2 * DEFAULT_SIGMA) ** 2))))
    m = keypoint_metrics(pred.astype(np.float32), y, KeypointsSpec(count=3), (32, 32))
    assert 0.5 < oks < 0.95
    assert m["oks_ap"] == pytest.approx(float(np.mean(THRESHOLDS <= oks)), abs=1e-6)
    assert m["oks_ap50"] == 1.0 and m["oks_ap75"] == float(oks >= 0.75)


@pytest.mark.parametrize("amplitudes, ap", [((0.5, 1.0), 51 * 0.5 / 101), ((1.0, 0.5), 51 / 101)])
def test_instances_are_ranked_by_their_heatmap_peaks(amplitudes, ap):
    """Image 0 right, image 1 wrong (another figure's keypoints): AP at 101 recall points is 0.5
    precision up to recall 0.5 when the wrong one scores higher, 1.0 when the right one does."""
    y = _labels(2, 4, seed=1)
    wrong = y.copy()
    wrong[1, :, :2] = y[0, :, :2][::-1]
    heat = _heatmaps(wrong, np.asarray(amplitudes))
    m = keypoint_metrics(heat, y, KeypointsSpec(count=4, subpixel=False), (32, 32))
    assert m["oks_ap50"] == pytest.approx(ap, abs=1e-6)


def test_shifted_keypoints_lower_oks_ap_and_pck():
    y = _labels(40)
    aps = []
    for shift in (0.0, 1.0, 2.0, 4.0):
        m = keypoint_metrics((y[..., :2] + shift).astype(np.float32), y, KeypointsSpec(count=4), (32, 32))
        aps.append(m["oks_ap"])
    assert aps[0] == 1.0 and aps == sorted(aps, reverse=True) and aps[-1] < 0.2


def test_an_unlabelled_keypoint_is_not_scored():
    y = _labels()
    pred = y[..., :2].copy()
    y[:, 0, 2] = 0
    pred[:, 0] += 10.0  # far from a label nobody gave
    m = keypoint_metrics(pred, y, KeypointsSpec(count=4), (32, 32))
    assert m["oks_ap"] == 1.0 and m["pck"] == 1.0 and m["per_keypoint"]["0"] is None


def test_heatmaps_decode_to_the_cell_centre_with_a_quarter_cell_step():
    heat = np.zeros((1, 1, 8, 8), np.float32)
    heat[0, 0, 2, 5] = 1.0
    heat[0, 0, 2, 6] = 0.5  # the right neighbour is higher than the left one
    plain, _ = decode(heat, (16, 16), subpixel=False)
    sub, score = decode(heat, (16, 16))
    assert plain[0, 0].tolist() == [11.0, 5.0]  # cell (2, 5) of stride 2: centre (5.5, 2.5) * 2
    assert sub[0, 0].tolist() == [11.5, 5.0] and score[0, 0] == 1.0


def test_heatmap_targets_decode_back_to_their_labels():
    y = _labels(30)
    m = keypoint_metrics(_heatmaps(y), y, KeypointsSpec(count=4), (32, 32))
    assert m["oks_ap"] == 1.0 and max(v["error_px"] for v in m["per_keypoint"].values()) < 0.4


def test_the_gates_bootstrap_pairs_the_images():
    y = _labels(60)
    rng = np.random.default_rng(3)
    good = keypoint_metrics((y[..., :2] + rng.normal(0, 0.7, y[..., :2].shape)).astype(np.float32), y,
                            KeypointsSpec(count=4), (32, 32))  # fmt: skip
    bad = keypoint_metrics((y[..., :2] + rng.normal(0, 2.5, y[..., :2].shape)).astype(np.float32), y,
                           KeypointsSpec(count=4), (32, 32))  # fmt: skip
    records = good["per_sample"]["keypoints"]
    assert map_from_records(records, np.ones((1, 60)), "map")["map"][0] == pytest.approx(
        good["oks_ap"], abs=1e-6
    )
    up = significance("oks_ap", good, bad, 0.05)
    assert up["significant"] and up["low"] > 0 and "per_class" not in up
    assert up["gain"] == pytest.approx(good["oks_ap"] - bad["oks_ap"], abs=1e-6)
    same = significance("oks_ap75", good, good, 0.05)
    assert not same["significant"] and same["low"] == same["high"] == 0.0
    pck = significance("pck", good, bad, 0.05)
    assert pck["significant"] and pck["test"].startswith("paired bootstrap")


def test_outputs_and_labels_of_other_shapes_are_one_line():
    y = _labels()
    with pytest.raises(EvaluationError, match=r"^keypoints: the model's output has shape \[12, 4, 3\], expected "
                       r"heatmaps \[12, 4, H, W\] or coordinates \[12, 4, 2\]$"):  # fmt: skip
        keypoint_metrics(np.zeros((12, 4, 3), np.float32), y, KeypointsSpec(count=4), (32, 32))
    with pytest.raises(EvaluationError, match=r"y has shape \[12, 4, 3\], expected \[N, 5, 3\]"):
        keypoint_metrics(np.zeros((12, 5, 2), np.float32), y, KeypointsSpec(count=5), (32, 32))


@pytest.mark.parametrize("y, message", [
    (np.zeros((4, 5, 2), np.float32), r"^y has shape \[4, 5, 2\], expected keypoints \[N, 5, 3\] \(x, y, visibility"),
    (np.zeros((4, 5, 3), np.int64), r"^y has dtype int64, expected float32 keypoints \[N, 5, 3\]"),
    (np.full((4, 5, 3), 3.0, np.float32), r"^y has keypoint visibilities \[3.0\], expected 0 \(not labelled\), 1"),
])  # fmt: skip
def test_bad_labels_name_the_field_and_what_was_expected(y, message):
    with pytest.raises(DataError, match=message) as err:
        check_keypoints(y, 5)
    assert "\n" not in str(err.value)
