"""Task segmentation in a recipe: mIoU is its default promotion metric, its [segmentation] table has
documented defaults, and every wrong field is one line naming it; its host data check reads masks."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import DataError, RecipeError
from tasks.recipe.datafiles import check_dataset
from tasks.recipe.load import parse_recipe
from tasks.recipe.segmentation import IGNORE_INDEX, class_names, segmentation_of
from tests.prepare.kit import BASE, merge

SEGMENTATION = {"task": "segmentation", "model": {"num_classes": 3, "input_shape": [1, 4, 4]}}
BAD = [  # (change to the segmentation recipe, field named in the error, words of the expectation)
    ({"segmentation": {"ignore_index": 2}}, "segmentation.ignore_index", "outside the classes [0, 2]"),
    ({"segmentation": {"classes": ["a", "b"]}}, "segmentation.classes", "3 names"),
    ({"segmentation": {"classes": ["a", "a", "b"]}}, "segmentation.classes", "distinct"),
    ({"segmentation": {"background": 3}}, "segmentation.background", "-1 for none"),
    ({"segmentation": {"ignore": 255}}, "segmentation.ignore", "known key"),
    ({"model": {"num_classes": None}}, "model.num_classes", "required for task 'segmentation'"),
    ({"loss": {"kind": "mse"}}, "loss.kind", "cross-entropy, dice, cross-entropy+dice"),
    ({"promotion": {"metric": "accuracy"}}, "promotion.metric", "'miou', 'pixel_accuracy' or 'loss'"),
    (
        {"data": {"train": None, "board_dataset": "datasets/masks", "board_format": "image-folder"}},
        "data.board_format",
        "an image folder's labels are classes, not masks",
    ),
]
NOT_SEGMENTATION = [
    ({"segmentation": {"background": 0}}, "segmentation", "only with task = 'segmentation'"),
    ({"loss": {"kind": "dice"}}, "loss.kind", "'dice' only with task = 'segmentation'"),
    ({"promotion": {"metric": "miou"}}, "promotion.metric", "miou needs task = 'segmentation'"),
]


@pytest.mark.parametrize(
    ("change", "field", "words"), BAD, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(BAD)]
)
def test_a_wrong_segmentation_field_is_one_line_naming_it(tmp_path, change, field, words):
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(merge(BASE, SEGMENTATION), change), tmp_path / "r.toml")
    assert info.value.field == field and words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("change", "field", "words"), NOT_SEGMENTATION, ids=[f for _, f, _ in NOT_SEGMENTATION]
)
def test_segmentation_fields_outside_the_task_are_refused(tmp_path, change, field, words):
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(BASE, change), tmp_path / "r.toml")
    assert info.value.field == field and words in str(info.value)


def test_miou_is_the_default_metric_and_the_table_has_defaults(tmp_path):
    recipe = parse_recipe(merge(BASE, SEGMENTATION), tmp_path / "r.toml")
    assert recipe.promotion.metric == "miou" and recipe.segmentation is None
    spec = segmentation_of(recipe)
    assert spec.ignore_index == IGNORE_INDEX == 255 and spec.background == 0
    assert class_names(recipe) == ("0", "1", "2")
    for kind in ("dice", "cross-entropy+dice"):
        assert parse_recipe(merge(merge(BASE, SEGMENTATION), {"loss": {"kind": kind}}), tmp_path / "r.toml")
    torch_default = merge(SEGMENTATION, {"segmentation": {"ignore_index": -100, "background": -1}})
    assert segmentation_of(parse_recipe(merge(BASE, torch_default), tmp_path / "r.toml")).ignore_index == -100


def test_the_host_checks_masks_against_the_classes_and_the_ignore_index(tmp_path):
    recipe = parse_recipe(merge(BASE, SEGMENTATION), tmp_path / "r.toml")
    x = np.zeros((3, 1, 4, 4), np.float32)
    y = np.zeros((3, 4, 4), np.int64)
    y[1, 0] = 255
    check_dataset(recipe, x, y)
    y[2, 3, 3] = 3
    with pytest.raises(DataError, match=r"y has mask labels \[3\], expected classes in \[0, 2\] or "
                                        r"segmentation.ignore_index \(255\) \(sample 2\)"):  # fmt: skip
        check_dataset(recipe, x, y)
    with pytest.raises(DataError, match=r"expected masks \[N, 4, 4\]"):
        check_dataset(recipe, x, np.zeros((3, 4), np.int64))
    with pytest.raises(DataError, match="expected int64 masks"):
        check_dataset(recipe, x, np.zeros((3, 4, 4), np.float32))
