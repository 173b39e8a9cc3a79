"""Host-side model building: torchvision by name with a new head and local ImageNet-style weights."""

from __future__ import annotations

import pytest
import torch

from tasks.errors import ModelError, RecipeError
from tasks.prepare.export.torch_model import build_model
from tests.prepare.kit import tiny_recipe

TV = {
    "model": {
        "callable": None,
        "torchvision": "mobilenet_v3_small",
        "num_classes": 2,
        "input_shape": [3, 32, 32],
    }
}


def test_torchvision_local_weights_keep_new_head(tmp_path):
    from torchvision import models

    torch.manual_seed(1)
    imagenet = models.mobilenet_v3_small(weights=None, num_classes=1000).state_dict()
    torch.save(imagenet, tmp_path / "imagenet.pt")
    model = build_model(tiny_recipe(tmp_path, {**TV, "model": {**TV["model"], "weights": "imagenet.pt"}}))
    state = model.state_dict()
    assert torch.equal(state["features.0.0.weight"], imagenet["features.0.0.weight"])
    assert state["classifier.3.weight"].shape == (2, 1024) and not model.training


def test_torchvision_errors(tmp_path):
    with pytest.raises(RecipeError, match="model.torchvision"):
        build_model(tiny_recipe(tmp_path, {**TV, "model": {**TV["model"], "torchvision": "no_such_net"}}))
    torch.save({"features.0.0.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ModelError, match="cannot load weights"):
        build_model(tiny_recipe(tmp_path, {**TV, "model": {**TV["model"], "weights": "bad.pt"}}))
