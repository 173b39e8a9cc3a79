"""Export without a deep copy (the caller's model comes back bit-identical, also after a failure) and
exporter failures as one ModelError line naming the operator, the module and the way out."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from torch import nn

from tasks.errors import ModelError
from tasks.prepare.export.torchscript import check_onnx, export_torch
from tasks.prepare.messages import export_failure
from tests.prepare.kit import tiny_recipe


class Odd(nn.Module):
    """Uses ``cummax``, which the TorchScript exporter cannot export at opset 17."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cummax(x, 1)[0]


class Uncopyable(nn.Module):
    """A tiny CNN that holds a module object, a lock and an open file (deepcopy raises on them)."""

    def __init__(self, log_path, odd: bool = False) -> None:
        super().__init__()
        self.lib, self.lock, self.log = math, threading.Lock(), open(log_path, "w")  # noqa: SIM115
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 4 * 4, 3)
        self.odd = Odd() if odd else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.odd(self.head(torch.flatten(torch.relu(self.bn(self.conv(x))), 1)))


def _uncopyable(tmp_path, odd=False):
    torch.manual_seed(0)
    model = Uncopyable(tmp_path / "held.log", odd)
    with torch.no_grad():
        model.bn.running_mean.uniform_()
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.num_batches_tracked.fill_(7)
    model.train()
    model.head.eval()  # mixed flags, to see each one restored
    return model


def _state(model):
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        {k: id(v) for k, v in model.state_dict(keep_vars=True).items()},
        {name: m.training for name, m in model.named_modules()},
        model.bn.momentum,
    )


def _assert_same(model, before):
    values, ids, flags, momentum = _state(model)
    assert ids == before[1] and flags == before[2] and momentum == before[3]
    assert all(torch.equal(values[k], v) for k, v in before[0].items())


def test_export_leaves_an_uncopyable_model_as_it_was(tmp_path):
    model = _uncopyable(tmp_path)
    before = _state(model)
    path = export_torch(tiny_recipe(tmp_path), model, tmp_path / "model.onnx")
    check_onnx(path)
    _assert_same(model, before)
    model.log.close()


def test_failed_export_is_one_line_naming_the_module_and_restores_the_model(tmp_path, capfd):
    model = _uncopyable(tmp_path, odd=True)
    before = _state(model)
    with pytest.raises(ModelError) as info:
        export_torch(tiny_recipe(tmp_path), model, tmp_path / "model.onnx")
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert "operator cummax in odd (Odd)" in message and "rewrite odd with operators" in message
    assert "Torch IR graph" not in capfd.readouterr().out  # the exporter's dump stayed captured
    _assert_same(model, before)
    model.log.close()


def test_mnasnet_exports_without_a_deep_copy(tmp_path):
    from torchvision import models

    model = models.mnasnet1_0(weights=None, num_classes=2).eval()
    recipe = tiny_recipe(tmp_path, {"model": {"input_shape": [3, 32, 32]}})
    check_onnx(export_torch(recipe, model, tmp_path / "mnasnet.onnx"))


def test_alexnet_small_input_names_the_adaptive_pool(tmp_path):
    from torchvision import models

    model = models.alexnet(weights=None, num_classes=2).eval()
    recipe = tiny_recipe(tmp_path, {"model": {"input_shape": [3, 63, 63]}})
    with pytest.raises(ModelError) as info:
        export_torch(recipe, model, tmp_path / "alexnet.onnx")
    message = str(info.value)
    assert "\n" not in message and "[Caused by" not in message
    assert "operator adaptive_avg_pool2d in avgpool (AdaptiveAvgPool2d)" in message
    assert "feature map before avgpool is a multiple of its output size" in message


def test_export_failure_finds_the_module_in_the_printed_graph(tmp_path):
    from torch.onnx.errors import UnsupportedOperatorError

    dump = (
        "Torch IR graph at exception: graph(%x : Float(2, 4)):\n"
        "  %3 : Float(2, 4) = aten::relu(%x), scope: m.Net::/m.Body::body\n"
        "  %7 : Float(2, 4), %8 : Long(2, 4) = aten::cummax(%3, %5), "
        "scope: m.Net::/m.Body::body/m.Scan::body.scan # m.py:3:0\n"
    )
    exc = UnsupportedOperatorError("aten::cummax", 17, None)
    message = export_failure(tiny_recipe(tmp_path), exc, dump)
    assert "operator cummax in body.scan (Scan): Exporting the operator 'aten::cummax'" in message
    generic = export_failure(tiny_recipe(tmp_path), RuntimeError("boom\nsecond line"), "")
    assert generic == (
        "cannot export tinymodels:tiny to ONNX: boom; simplify or replace the code that uses it; "
        "the exporter's output is logged at DEBUG level"
    )


class AuxNet(nn.Module):
    """Like GoogLeNet / Inception v3: an auxiliary head in training mode only, which cannot run at
    4x4 inputs (its pooling needs 5x5), and a Dropout below the root that must stay trainable."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(4, 3)
        self.aux = nn.Sequential(nn.AvgPool2d(5), nn.Flatten(), nn.Linear(4, 3))

    def forward(self, x):
        y = torch.relu(self.conv(x))
        out = self.head(self.drop(y.mean(dim=(2, 3))))
        return (out, self.aux(y)) if self.training else out


def test_auxiliary_outputs_are_left_out_of_the_training_graph(tmp_path):
    import onnx

    from tasks.prepare.export.tracing import has_auxiliary_outputs
    from tasks.prepare.runtimes.ort_training.artifacts import generate

    recipe = tiny_recipe(tmp_path)
    model = AuxNet().eval()
    assert has_auxiliary_outputs(model, (torch.randn(2, 1, 4, 4),), 1)
    assert not has_auxiliary_outputs(model.head, (torch.randn(2, 4),), 1)
    assert not model.training  # the probe put the model back
    path = export_torch(recipe, model, tmp_path / "model.onnx")
    graph = onnx.load(str(path)).graph
    assert [o.name for o in graph.output] == ["output"]
    assert not any(i.name.startswith("aux.") for i in graph.initializer)
    assert "Dropout" in {n.op_type for n in graph.node}  # the layers below the root trained as usual
    manifest = generate(recipe, path, tmp_path / "out")
    assert manifest["trainable"] == ["head.weight", "head.bias"]


@pytest.mark.parametrize("own_random", [False, True])
def test_random_layers_never_reach_the_inference_model(tmp_path, own_random):
    """torchvision's StochasticDepth traces in eval mode (no random node); a random op it cannot
    remove makes validation fail, naming its layer: the board's model would answer at random."""
    import onnx

    from tasks.errors import ValidationFailed
    from tasks.prepare.pipeline import prepare

    recipe = tiny_recipe(
        tmp_path, {"model": {"callable": "tinymodels:random_depth", "kwargs": {"own_random": own_random}}}
    )
    if not own_random:
        done = prepare(recipe, tmp_path / "out")
        assert not any(n.op_type.startswith("Random") for n in onnx.load(str(done.model_onnx)).graph.node)
        return
    with pytest.raises(ValidationFailed, match="two different answers.*random node") as err:
        prepare(recipe, tmp_path / "out")
    assert err.value.check == "inference_matches_torch"


class Folding(nn.Module):
    """``F.fold`` with its output size read from the input's shape, as MobileViTV2 folds its
    patches back: the exporter's own translation of col2im breaks on it with a TypeError."""

    def forward(self, x):
        patches = nn.functional.unfold(x, 2, stride=2)
        folded = nn.functional.fold(patches, output_size=(x.shape[2], x.shape[3]), kernel_size=2, stride=2)
        return folded.flatten(1)[:, :3]


def test_an_exporter_that_breaks_in_its_own_code_is_not_quoted_raw(tmp_path):
    """Issue 53: MobileViTV2's stop showed the exporter's own "'NoneType' object is not
    subscriptable". The line says whose error it is, the likely cause and the way out."""
    from tasks.prepare.runtimes.autograd.template import export_inference

    recipe = tiny_recipe(tmp_path)
    explain = lambda exc, dump: ModelError(export_failure(recipe, exc, dump))  # noqa: E731 - as the runtime's
    with pytest.raises(ModelError) as info:  # the eval-mode export of the autograd runtime (opset 18 and up)
        export_inference(
            Folding(), (torch.zeros(2, 1, 4, 4),), ["input"], ["output"], tmp_path / "f.onnx", explain
        )
    message = str(info.value)
    assert "\n" not in message, message
    assert "torch's exporter broke in its own translation of col2im (TypeError: " in message, message
    assert "computed from a tensor's shape at run time; give " in message and "sizes fixed" in message
