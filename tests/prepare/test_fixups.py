"""Graph fix-ups: each one on a small model that ONNX Runtime 1.19.2 cannot differentiate without
it, the rewritten graph computing the same outputs, and the one-line message where none applies."""

from __future__ import annotations

import copy
import io

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tasks.errors import ArtifactError
from tasks.prepare import messages
from tasks.prepare.rewrites import batchnorm, fixups
from tasks.prepare.rewrites.batchnorm import fix_batchnorm
from tasks.prepare.runtimes.ort_training.generate import run_generate
from tasks.prepare.trainable import bn_statistics, float_params
from tests.prepare.kit import tiny_recipe


def export(module: nn.Module, shape: tuple[int, ...], *, training: bool = True) -> onnx.ModelProto:
    """A training-mode (or eval-mode) opset-17 export of ``module`` with a dynamic batch."""
    buf = io.BytesIO()
    module = copy.deepcopy(module)  # tracing in training mode moves BatchNorm statistics
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.0
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(module, (torch.randn(2, *shape),), buf, dynamo=False, training=mode, opset_version=17,
                      do_constant_folding=False, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "b"}, "output": {0: "b"}})  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


def generate(model: onnx.ModelProto, trainable: list[str], tmp_path) -> None:
    """ORT's generate_artifacts (through the pipeline's wrapper) with MSE on the one output."""
    from onnxruntime.training import artifacts

    model = onnx.ModelProto.FromString(model.SerializeToString())
    fix_batchnorm(model)
    frozen = [n for n in float_params(model) if n not in trainable and n not in bn_statistics(model)]
    recipe = tiny_recipe(tmp_path)
    run_generate(model, trainable, frozen, artifacts.LossType.MSELoss, recipe, tmp_path / "artifacts")


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


class HardNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.act = nn.Hardswish()
        self.gate = nn.Hardsigmoid()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y = self.act(self.conv(x))
        return self.head((y * self.gate(y)).mean(dim=(2, 3)))


class NormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.norm(self.proj(x)).mean(dim=1))


class DenseNet(nn.Module):
    """A dense block: the stem's output feeds three Concats below the trainable layer."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer1 = nn.Conv2d(4, 2, 3, padding=1)
        self.layer2 = nn.Conv2d(6, 2, 3, padding=1)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        t = self.stem(x)
        a = self.layer1(torch.cat([t], 1))
        b = self.layer2(torch.cat([t, a], 1))
        return self.head(torch.cat([t, a, b], 1).mean(dim=(2, 3)))


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 1)
        self.bn2 = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.bn2(self.conv2(torch.relu(self.bn(self.conv(x)))))).mean(dim=(2, 3)))


def calibrated_bn() -> BNNet:
    """BNNet with running statistics and affine parameters far from their init."""
    torch.manual_seed(0)
    net = BNNet()
    with torch.no_grad():
        for bn in (net.bn, net.bn2):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return net.eval()


def test_hard_activations_fail_without_and_train_with_the_decomposition(tmp_path):
    torch.manual_seed(0)
    model = export(HardNet(), (3, 6, 6))
    with pytest.raises(ArtifactError) as err:
        generate(model, ["conv.weight", "head.weight"], tmp_path)
    message = str(err.value)
    assert "no gradient for Hard" in message and "layer " in message and "\n" not in message
    assert ".cc:" not in message and "was false" not in message
    x = np.random.default_rng(0).standard_normal((3, 3, 6, 6), dtype=np.float32)
    before = run(model, x)
    assert fixups.decompose_hard_activations(model) == 2
    assert not {n.op_type for n in model.graph.node} & {"HardSwish", "HardSigmoid"}
    np.testing.assert_allclose(run(model, x), before, rtol=1e-5, atol=1e-6)
    generate(model, ["conv.weight", "head.weight"], tmp_path)


def test_layernorm_fails_without_and_trains_with_its_statistics(tmp_path):
    torch.manual_seed(0)
    model = export(NormNet(), (5, 6))
    with pytest.raises(ArtifactError):
        generate(model, ["proj.weight", "head.weight"], tmp_path)
    x = np.random.default_rng(0).standard_normal((3, 5, 6), dtype=np.float32)
    before = run(model, x)
    assert fixups.expose_gradient_outputs(model) == 1
    np.testing.assert_allclose(run(model, x), before, rtol=1e-6)
    generate(model, ["proj.weight", "head.weight"], tmp_path)


def test_shared_concat_inputs_fail_without_and_train_when_split(tmp_path):
    torch.manual_seed(0)
    model = export(DenseNet(), (3, 5, 5))
    trainable = ["layer1.weight", "layer1.bias", "head.weight"]
    with pytest.raises(ArtifactError, match="Duplicate definition"):
        generate(model, trainable, tmp_path)
    x = np.random.default_rng(0).standard_normal((3, 3, 5, 5), dtype=np.float32)
    before = run(model, x)
    assert fixups.split_shared_concats(model, trainable) == 2  # the Concats of layer2 and the head
    np.testing.assert_allclose(run(model, x), before, rtol=1e-5, atol=1e-6)
    generate(model, trainable, tmp_path)


@pytest.mark.parametrize(
    "trainable", [["head.weight"], ["conv2.weight", "bn2.weight", "bn2.bias", "head.weight"]]
)
def test_frozen_batchnorm_computes_the_eval_mode_model(trainable, tmp_path):
    net = calibrated_bn()
    x = np.random.default_rng(1).standard_normal((4, 3, 6, 6), dtype=np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    model = export(net, (3, 6, 6))
    fix_batchnorm(model)
    assert batchnorm.freeze_batchnorm(model, trainable) == 2
    assert "BatchNormalization" not in {n.op_type for n in model.graph.node}
    names = {i.name for i in model.graph.initializer}
    assert (
        {"bn2.weight", "bn2.bias"} <= names
        if "bn2.weight" in trainable
        else not names & {"bn2.weight", "bn.bias"}
    )
    assert not names & {"bn.running_mean", "bn.running_var"}
    np.testing.assert_allclose(run(model, x), expected, rtol=1e-5, atol=1e-5)
    generate(model, trainable, tmp_path)


def test_no_gradient_message_names_op_node_layer_and_way_out():
    model = export(HardNet(), (3, 6, 6))
    error = "gradient_builder_registry.cc:29 ... The gradient builder has not been registered: HardSwish for node /act/HardSwish"
    message = messages.no_gradient_message(error, model, ["conv.weight"])
    assert "HardSwish" in message and "/act/HardSwish" in message and "layer act" in message
    assert "trainable.strategy = 'classifier' avoids it" in message
    after_head = export(nn.Sequential(nn.Flatten(), nn.Linear(12, 2), nn.Hardswish()), (3, 2, 2))
    node = next(n.name for n in after_head.graph.node if n.op_type == "HardSwish")
    message = messages.no_gradient_message(
        f"The gradient builder has not been registered: HardSwish for node {node}", after_head, ["1.weight"]
    )
    assert "the classifier alone still needs it" in message
    assert messages.no_gradient_message("something else", model, []) is None


def test_layer_of_exporter_node_names():
    assert messages.layer_of("/features/features.1/block/block.1/fc2/Conv") == "features.1.block.1.fc2"
    assert messages.layer_of("/features/features.0/features.0.2/HardSwish") == "features.0.2"
    assert messages.layer_of("Conv_3") == "Conv_3"


@pytest.mark.parametrize(
    ("error", "kept"),
    [
        ("/onnxruntime_src/orttraining/orttraining/python/orttraining_pybind_state.cc:621 onnxruntime::python::"
         "addObjectMethodsForTraining(pybind11::module&)::<lambda(x*)> [ONNXRuntimeError] : 1 : FAIL : This is an "
         "invalid model. Error: Duplicate definition of name (t_grad).\n", "Duplicate definition of name (t_grad)"),
        ("/onnxruntime_src/orttraining/orttraining/core/graph/gradient_builder_base.h:123 onnxruntime::training::"
         "ArgDef onnxruntime::training::GradientBuilderBase::O(size_t, bool) const i < node_->OutputDefs().size() "
         "was false. \n", "an internal check of ONNX Runtime failed"),
    ],
)  # fmt: skip
def test_generate_failures_lose_the_cpp_text(error, kept):
    message = messages.generate_failure(error, export(HardNet(), (3, 6, 6)), [])
    assert kept in message and "\n" not in message
    assert ".cc:" not in message and ".h:" not in message and "onnxruntime::" not in message


class PoolNet(nn.Module):
    """AlexNet's tail: an overlapping MaxPool, then an adaptive pooling to the size it already has."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((3, 3))
        self.head = nn.Linear(36, 2)

    def forward(self, x):
        return self.head(torch.flatten(self.avgpool(self.pool(torch.relu(self.conv(x)))), 1))


def _train_step(tmp_path) -> float:
    from onnxruntime.training import api

    art = tmp_path / "artifacts"
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 7), dtype=np.float32)
    return float(module(x, np.zeros((2, 2), np.float32))[0])


def test_identity_pool_after_maxpool_fails_at_train_time_without_and_trains_when_dropped(tmp_path):
    torch.manual_seed(0)
    model = export(PoolNet(), (3, 7, 7))
    trainable = ["conv.weight", "head.weight"]
    generate(model, trainable, tmp_path)
    with pytest.raises(Exception, match="MaxPoolGrad"):
        _train_step(tmp_path)
    x = np.random.default_rng(0).standard_normal((3, 3, 7, 7), dtype=np.float32)
    before = run(model, x)
    assert fixups.drop_identity_pools(model) == 1
    np.testing.assert_allclose(run(model, x), before, rtol=1e-6)
    generate(model, trainable, tmp_path)
    assert np.isfinite(_train_step(tmp_path))


def test_ort_message_keeps_the_reason_only():
    from tasks.errors import ort_message

    text = (
        "RuntimeError: /onnxruntime_src/orttraining/training_api/module.cc:632 onnxruntime::common::Status "
        "onnxruntime::training::api::Module::TrainStep(const std::vector<OrtValue>&) [ONNXRuntimeError] : 6 : "
        "RUNTIME_EXCEPTION : Non-zero status code returned while running MaxPoolGrad node. Status Message: "
        "/onnxruntime_src/orttraining/training_ops/cpu/nn/pool_gradient_op.cc:45 onnxruntime::contrib::"
        "MaxPoolGrad<T>::Compute() const [with T = float] dY->Shape() == indices->Shape() was false. The shape "
        "of dY and indices does not match in MaxPoolGrad.\n"
    )
    assert ort_message(text) == (
        "RuntimeError: Non-zero status code returned while running MaxPoolGrad node. Status Message: "
        "The shape of dY and indices does not match in MaxPoolGrad."
    )


class EinsumAttention(nn.Module):
    """MaxViT's attention products, written with einsum."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(x.shape[0], 1, 5, 3, 4).unbind(3)
        attn = torch.einsum("bhid,bhjd->bhij", q, k).softmax(-1)
        return self.head(torch.einsum("bhij,bhjd->bhid", attn, v).mean(dim=(1, 2)))


def test_einsum_fails_without_and_trains_as_matmul(tmp_path):
    torch.manual_seed(0)
    model = export(EinsumAttention(), (5, 4))
    with pytest.raises(ArtifactError, match="no gradient for Einsum"):
        generate(model, ["qkv.weight", "head.weight"], tmp_path)
    x = np.random.default_rng(0).standard_normal((3, 5, 4), dtype=np.float32)
    before = run(model, x)
    assert fixups.einsum_as_matmul(model) == 2
    assert "Einsum" not in {n.op_type for n in model.graph.node}
    np.testing.assert_allclose(run(model, x), before, rtol=1e-5, atol=1e-6)
    generate(model, ["qkv.weight", "head.weight"], tmp_path)
