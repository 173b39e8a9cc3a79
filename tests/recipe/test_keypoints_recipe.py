"""Task keypoints in a recipe: OKS AP is its default promotion metric, its [keypoints] table has
documented defaults (COCO's OKS sigmas for 17 keypoints), and every wrong field is one line naming it;
its host data check reads COCO keypoint labels."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import DataError, RecipeError
from tasks.recipe.datafiles import check_dataset
from tasks.recipe.keypoints import COCO_SIGMAS, DEFAULT_SIGMA, keypoint_names, oks_sigmas
from tasks.recipe.load import parse_recipe
from tests.prepare.kit import BASE, merge

KEYPOINTS = {"task": "keypoints", "model": {"num_classes": None, "input_shape": [1, 8, 8]},
             "loss": {"kind": "mse"}, "keypoints": {"count": 3}}  # fmt: skip
BAD = [  # (change to the keypoints recipe, field named in the error, words of the expectation)
    ({"keypoints": None}, "keypoints.count", "required for task 'keypoints'"),
    ({"keypoints": {"count": 0}}, "keypoints.count", "an integer in [1, 1000]"),
    ({"keypoints": {"names": ["a", "b"]}}, "keypoints.names", "3 names"),
    ({"keypoints": {"names": ["a", "a", "b"]}}, "keypoints.names", "distinct"),
    ({"keypoints": {"sigmas": [0.1, 0.1]}}, "keypoints.sigmas", "3 OKS sigmas"),
    ({"keypoints": {"sigmas": [0.1, 0.0, 0.1]}}, "keypoints.sigmas", "OKS sigmas in (0, 10]"),
    ({"keypoints": {"heatmap_sigma": 0.0}}, "keypoints.heatmap_sigma", "a number in (0, 100]"),
    ({"keypoints": {"sigma": 2.0}}, "keypoints.sigma", "known key"),
    ({"loss": {"kind": "l1"}}, "loss.kind", "mse (heatmaps against Gaussian targets)"),
    ({"promotion": {"metric": "accuracy"}}, "promotion.metric", "'oks_ap', 'pck' or 'loss'"),
    ({"promotion": {"metric": "miou"}}, "promotion.metric", "miou needs task = 'segmentation'"),
    (
        {"data": {"train": None, "board_dataset": "datasets/poses", "board_format": "image-folder"}},
        "data.board_format",
        "an image folder's labels are classes, not keypoints",
    ),
]
NOT_KEYPOINTS = [
    ({"keypoints": {"count": 3}}, "keypoints", "only with task = 'keypoints'"),
    ({"promotion": {"metric": "oks_ap"}}, "promotion.metric", "oks_ap needs task = 'keypoints'"),
]


@pytest.mark.parametrize(
    ("change", "field", "words"), BAD, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(BAD)]
)
def test_a_wrong_keypoints_field_is_one_line_naming_it(tmp_path, change, field, words):
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(merge(BASE, KEYPOINTS), change), tmp_path / "r.toml")
    assert info.value.field == field and words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("change", "field", "words"), NOT_KEYPOINTS, ids=[f for _, f, _ in NOT_KEYPOINTS])
def test_keypoints_fields_need_the_task(tmp_path, change, field, words):
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(BASE, change), tmp_path / "r.toml")
    assert info.value.field == field and words in str(info.value)


def test_defaults(tmp_path):
    recipe = parse_recipe(merge(BASE, KEYPOINTS), tmp_path / "r.toml")
    assert recipe.promotion.metric == "oks_ap"
    spec = recipe.keypoints
    assert keypoint_names(spec) == ("0", "1", "2") and oks_sigmas(spec) == (DEFAULT_SIGMA,) * 3
    assert (spec.heatmap_sigma, spec.subpixel, spec.pck_threshold) == (2.0, True, 0.1)
    coco = parse_recipe(merge(merge(BASE, KEYPOINTS), {"keypoints": {"count": 17}}), tmp_path / "r.toml")
    assert oks_sigmas(coco.keypoints) == COCO_SIGMAS


def test_the_host_data_check_reads_coco_keypoints(tmp_path):
    recipe = parse_recipe(merge(BASE, KEYPOINTS), tmp_path / "r.toml")
    x = np.zeros((4, 1, 8, 8), np.float32)
    y = np.zeros((4, 3, 3), np.float32)
    y[..., 2] = 2
    check_dataset(recipe, x, y)
    with pytest.raises(DataError, match=r"y has shape \[4, 2, 3\], expected keypoints \[N, 3, 3\]"):
        check_dataset(recipe, x, y[:, :2])
    y[1, 2] = [1.0, 2.0, 5.0]
    with pytest.raises(DataError, match=r"visibilities \[5.0\], expected 0 .* \(sample 1\)"):
        check_dataset(recipe, x, y)
