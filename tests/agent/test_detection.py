"""SSD box arithmetic of device_agent/detection.py (numpy only): priors, matching, encoding,
NMS against torchvision's, and the post-processing a board application runs."""

from __future__ import annotations

import numpy as np
import pytest

from device_agent import detection as det

# the SSD-Lite MobileNetV2 layout at 300 px (feature maps of 19, 10, 5, 3, 2, 1 cells)
SSDLITE_300 = [
    det.FeatureSpec(19, 60, 105),
    det.FeatureSpec(10, 105, 150),
    det.FeatureSpec(5, 150, 195),
    det.FeatureSpec(3, 195, 240),
    det.FeatureSpec(2, 240, 285),
    det.FeatureSpec(1, 285, 330),
]


def random_boxes(rng: np.random.Generator, n: int) -> np.ndarray:
    xy = rng.uniform(0, 0.7, (n, 2))
    wh = rng.uniform(0.05, 0.3, (n, 2))
    return np.concatenate([xy, xy + wh], axis=1).astype(np.float32)


def test_priors_of_the_ssdlite_layout():
    p = det.priors(SSDLITE_300, 300)
    assert p.shape == (6 * (19 * 19 + 10 * 10 + 5 * 5 + 9 + 4 + 1), 4) == (3000, 4)
    assert p.dtype == np.float32 and (p >= 0).all() and (p <= 1).all()
    np.testing.assert_allclose(p[0], [0.5 / 19, 0.5 / 19, 0.2, 0.2], rtol=1e-6)
    np.testing.assert_allclose(p[1, 2], np.sqrt(60 * 105) / 300, rtol=1e-6)
    np.testing.assert_allclose(p[2, 2] / p[2, 3], 2.0, rtol=1e-5)  # the 2:1 prior


def test_encode_decode_round_trip():
    rng = np.random.default_rng(0)
    p = det.priors(SSDLITE_300, 300)[:50]
    boxes = random_boxes(rng, 50)
    np.testing.assert_allclose(det.decode(det.encode(boxes, p), p), boxes, atol=1e-5)


def test_match_assigns_every_object_a_prior():
    p = det.priors(SSDLITE_300, 300)
    exact = det.center_to_corner(p[100:101])
    tiny = np.array([[0.50, 0.50, 0.52, 0.53]], np.float32)  # overlaps every prior by < 0.5
    classes, offsets = det.match(np.concatenate([exact, tiny]), np.array([4, 1]), p)
    assert classes[100] == 5 and np.abs(offsets[100]).max() < 1e-4
    assert (classes == 2).sum() == 1  # the tiny box kept its best prior
    assert set(np.unique(classes)) <= {0, 2, 5}
    empty_classes, empty_offsets = det.match(np.zeros((0, 4), np.float32), np.zeros(0, np.int64), p)
    assert not empty_classes.any() and not empty_offsets.any()


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_nms_keeps_what_torchvision_keeps(threshold):
    import torch
    from torchvision.ops import nms as tv_nms

    rng = np.random.default_rng(1)
    boxes = random_boxes(rng, 300)
    scores = rng.uniform(size=300).astype(np.float32)
    expected = tv_nms(torch.from_numpy(boxes), torch.from_numpy(scores), threshold).numpy()
    np.testing.assert_array_equal(det.nms(boxes, scores, threshold, top_k=1000), expected)


def test_postprocess_decodes_suppresses_and_thresholds():
    p = det.priors(SSDLITE_300, 300)
    target = np.array([[0.2, 0.2, 0.5, 0.5], [0.6, 0.6, 0.9, 0.95]], np.float32)
    offsets = det.encode(np.repeat(target[:1], len(p), axis=0), p)[None]
    offsets[0, 2000] = det.encode(target[1:], p[2000:2001])[0]
    scores = np.zeros((1, len(p), 3), np.float32)
    scores[0, :, 0] = 1.0
    scores[0, [10, 11, 12], 1] = [0.9, 0.8, 0.2]  # three priors pointing at the same box: one kept
    scores[0, 2000, 2] = 0.7
    ((boxes, labels, conf),) = det.postprocess(scores, offsets, p)
    np.testing.assert_array_equal(labels, [0, 1])
    np.testing.assert_allclose(conf, [0.9, 0.7])
    np.testing.assert_allclose(boxes, target, atol=1e-5)
