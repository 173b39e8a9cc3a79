"""Trainable selection found in the graph (tasks.prepare.selection): the last feature layer on the
main path before the classifier, whatever the architecture, and the ``suffix`` strategy's budget."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tasks.errors import RecipeError
from tasks.prepare import selection, trainable
from tasks.prepare.trainable import bn_statistics, find_classifier, float_params
from tests.prepare.test_fixups import export


def _params(model):
    stats = bn_statistics(model)
    return {k: v for k, v in float_params(model).items() if k not in stats}


def _last(module: nn.Module, shape=(3, 16, 16)) -> list[str]:
    model = export(module.eval(), shape)
    params = _params(model)
    _, node = find_classifier(model, params)
    return trainable.find_last_conv(model, params, node)


class SEStage(nn.Module):
    """The last block ends in a squeeze-excitation gate whose convs come after the main conv."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.main = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.se_reduce = nn.Conv2d(8, 2, 1)
        self.se_expand = nn.Conv2d(2, 8, 1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.main(torch.relu(self.stem(x)))))
        gate = torch.sigmoid(self.se_expand(torch.relu(self.se_reduce(y.mean((2, 3), keepdim=True)))))
        return self.fc((y * gate).mean((2, 3)))


class TokenNet(nn.Module):
    """A conv stem, then blocks of Linear layers over tokens (LeViT, EdgeNeXt): the last token
    Linear is the feature layer nearest the head, not the stem."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, stride=4)
        self.mlp1 = nn.Linear(8, 16)
        self.mlp2 = nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        t = self.stem(x).flatten(2).transpose(1, 2)  # [N, 16 tokens, 8]
        t = t + self.mlp2(torch.nn.functional.gelu(self.mlp1(t)))
        return self.fc(self.norm(t).mean(1))


class DeepClassifier(nn.Module):
    """A VGG-style classifier of two Linear layers: the feature layer stays the last conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.hidden = nn.Linear(8 * 4 * 4, 32)
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(
            torch.relu(self.hidden(nn.functional.avg_pool2d(torch.relu(self.conv(x)), 4).flatten(1)))
        )


@pytest.mark.parametrize("size", [16, 1])  # at 1x1 the gate and the map have the same size
def test_a_squeeze_excitation_gate_is_not_the_last_conv(size):
    assert _last(SEStage(), (3, size, size)) == ["main.weight", "main.bias", "bn.weight", "bn.bias"]


class ShortcutProjection(nn.Module):
    """A residual block whose shortcut projection comes after the main arm in graph order."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.down = nn.Conv2d(3, 8, 1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        main = self.conv2(torch.relu(self.conv1(x)))
        return self.fc(torch.relu(main + self.down(x)).mean((2, 3)))


def test_the_main_arm_of_a_residual_block_wins_over_its_shortcut():
    assert _last(ShortcutProjection()) == ["conv2.weight", "conv2.bias"]


def test_linear_layers_over_tokens_are_feature_layers_the_stem_is_not():
    chosen = _last(TokenNet())
    assert "stem.weight" not in chosen and "mlp2.weight" in chosen


def test_a_multi_layer_classifier_keeps_the_last_conv():
    assert _last(DeepClassifier()) == ["conv.weight", "conv.bias"]


def test_a_model_without_feature_layers_is_refused_with_the_field():
    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * 16 * 16, 4)

        def forward(self, x):
            return self.fc(x.flatten(1))

    with pytest.raises(RecipeError, match="trainable.strategy"):
        _last(Flat())


def test_suffix_fits_the_budget_and_is_one_cut(tmp_path):
    torch.manual_seed(0)
    model = export(SEStage().eval(), (3, 16, 16))
    params = _params(model)
    _, node = find_classifier(model, params)
    total = sum(params.values())
    sizes = []
    for budget in (40, 700, total):
        cut, after = selection.suffix_cut(model, params, budget, node)
        assert sum(params[p] for p in after) <= budget
        sizes.append(len(after))
    assert sizes[0] < sizes[1] < sizes[2] == len(params)  # a larger budget trains a longer suffix
    with pytest.raises(RecipeError, match="trainable.max_params.*at least the classifier"):
        selection.suffix_cut(model, params, 10, node)


def test_train_from_counts_weights_read_through_a_transpose():
    model = export(TokenNet().eval(), (3, 16, 16))
    params = _params(model)
    mlp = next(n for n in model.graph.node if n.op_type == "MatMul" and "mlp1" in n.name)
    assert "mlp1.weight" not in mlp.input  # the exporter transposes the weight first
    assert {"mlp1.weight", "mlp2.weight", "fc.weight"} <= set(trainable.after(model, mlp.name, params))


def test_suffix_strategy_trains_what_the_prefix_cache_skips(tmp_path):
    from tasks.prepare.pipeline import prepare
    from tests.prepare.kit import tiny_recipe

    recipe = tiny_recipe(tmp_path, {"trainable": {"strategy": "suffix", "max_fraction": 0.95}})
    done = prepare(recipe, tmp_path / "out")
    cache = done.manifest["prefix_cache"]
    assert cache["enabled"] and done.manifest["trainable"] == [
        "bn.weight",
        "bn.bias",
        "head.weight",
        "head.bias",
    ]
    model_params = {"conv.weight", "conv.bias", *done.manifest["trainable"]}
    assert not model_params & set(cache["suffix_frozen"])  # every parameter after the cut trains
