"""Which loss the autograd step of a segmentation or keypoints recipe takes: the recipe's kind on
its output's shape (heatmaps or coordinates; cross-entropy, Dice or both per pixel), labels of the
task's shape and dtype, the ORT path's manifest name, and a wrong output shape in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.errors import RecipeError
from tasks.paths import PROJECT_ROOT
from tasks.prepare.runtimes.autograd.task_losses import task_loss
from tasks.recipe.load import load_recipe

AUTOGRAD = {"training.runtime": "autograd"}


def _recipe(name: str, **more):
    return load_recipe(PROJECT_ROOT / "recipes" / f"{name}.toml", AUTOGRAD | more)


@pytest.mark.parametrize(("shape", "name"), [((7, 5, 32, 32), "mse of heatmaps (Gaussian targets, sigma 2)"),
                                             ((7, 5, 2), "mse of coordinates")])  # fmt: skip
def test_keypoints_take_the_loss_of_their_output(shape, name):
    fn, got, fallback = task_loss(_recipe("keypoints"), torch.zeros(shape), "out")
    assert got == name and fallback.shape == (7, 5, 3) and fallback.dtype == np.float32
    labels = torch.zeros((7, 5, 3))
    labels[:, :, :2], labels[:, 0, 2] = 16.0, 2.0  # one labelled keypoint per sample
    assert (
        fn(torch.zeros(shape), labels).item() > 0
        and fn(torch.zeros(shape), torch.zeros((7, 5, 3))).item() == 0
    )


@pytest.mark.parametrize("kind", ["cross-entropy", "dice", "cross-entropy+dice"])
def test_segmentation_takes_the_recipes_kind(kind):
    fn, got, fallback = task_loss(
        _recipe("segmentation", **{"loss.kind": kind}), torch.zeros(7, 4, 32, 32), "s"
    )
    assert got == f"{kind} (per pixel, ignore_index 255)"
    assert fallback.shape == (7, 32, 32) and fallback.dtype == np.int64
    labels = torch.full((7, 32, 32), 255)
    labels[:, :16] = 1
    loss = fn(torch.zeros(7, 4, 32, 32, requires_grad=True), labels)
    assert loss.item() > 0 and loss.requires_grad


@pytest.mark.parametrize(("recipe", "shape", "words"), [
    ("segmentation", (7, 3, 32, 32), "output 's' has shape [batch, 3, 32, 32]"),
    ("keypoints", (7, 5, 3), "output 's' has shape [batch, 5, 3]"),
])  # fmt: skip
def test_an_output_of_another_shape_is_one_line(recipe, shape, words):
    with pytest.raises(RecipeError) as err:
        task_loss(_recipe(recipe), torch.zeros(shape), "s")
    assert err.value.field == "loss.kind" and words in str(err.value) and "\n" not in str(err.value)
