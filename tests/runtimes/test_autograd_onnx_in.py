"""An ONNX model the user did not train (``[model] onnx``) under the autograd runtime, prepared by
``odl prepare`` with ``onnxruntime.training`` unimportable: a small CNN with BatchNorm exported as
users' files are made (TorchScript in eval mode with BatchNorm kept, with it folded into the
convolutions, and the dynamo exporter at opset 18), cut before its classifier and given a new head.
Its PyTorch twin (onnx2torch) computes what model.onnx computes; each gradient of the train step
equals PyTorch's autograd on that twin; the agent's autograd runtime trains it; the trained inference
model differs from model.onnx in the trainable tensors only (BatchNorm statistics and frozen layers
kept byte for byte); where onnxruntime-training is installed, it trains as the ORT runtime does."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

from tasks.prepare.board_job import build_job_spec
from tasks.prepare.runtimes.autograd.from_onnx import torch_twin
from tests.fixtures_prepare import needs_ort_training
from tests.runtimes.kit import assert_trained_alike, prepared_by_odl, run_job, step_losses

pytestmark = pytest.mark.slow  # one odl prepare per export (15-40 s on a loaded machine), shared by its tests
# "view": x.view(x.size(0), -1) before the classifier, BN folded, the file kept whole (no cut, no
# head; its output keeps the file's name, not the recipe's "logits"), trained from its last conv
EXPORTS = ("bn-kept", "bn-folded", "dynamo18", "view")
SIZE, CLASSES = 12, 3
STEPS = 12
RECIPE = """name = "onnx-in-{how}"
task = "classification"
[model]
onnx = "model_in.onnx"
cut_at = ["{cut}"]
input_shape = [3, {size}, {size}]
input_names = ["input"]
output_names = ["logits"]
[head]
num_classes = {classes}
[trainable]
train_from = "{last_conv}"
[loss]
kind = "cross-entropy"
[optimizer]
kind = "adamw"
lr = 1e-2
[training]
runtime = "autograd"
batch_size = 8
epochs = 2
[data]
train = "train.npz"
test = "test.npz"
"""


class SmallCnn(nn.Module):
    """conv + BN + ReLU twice, global pooling, a classifier: the shape of torchvision's CNNs."""

    def __init__(self, view: bool = False) -> None:
        super().__init__()
        self.view = view
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())  # fmt: skip
        self.classifier = nn.Linear(16, 10)

    def forward(self, x):
        pooled = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(pooled.view(pooled.size(0), -1) if self.view else torch.flatten(pooled, 1))


def _export(how: str, path: Path) -> None:
    torch.manual_seed(0)
    model = SmallCnn(view=how == "view").train()
    with torch.no_grad():  # BatchNorm statistics of some data: not the initial zeros and ones
        for _ in range(4):
            model(torch.randn(16, 3, SIZE, SIZE) * 2 + 0.5)
    model.eval()
    x, buf = torch.randn(1, 3, SIZE, SIZE), io.BytesIO()
    if how == "dynamo18":
        batch = torch.export.Dim("batch", min=1, max=1024)
        torch.onnx.export(model, (x,), buf, dynamo=True, opset_version=18, input_names=["input"],
                          dynamic_shapes={"x": {0: batch}})  # fmt: skip
    else:
        mode = torch.onnx.TrainingMode.PRESERVE if how == "bn-kept" else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17, training=mode,
                          do_constant_folding=how != "bn-kept", input_names=["input"],
                          dynamic_axes={"input": {0: "batch"}})  # fmt: skip
    path.write_bytes(buf.getvalue())


def _write(folder: Path, how: str) -> Path:
    """The exported file, data and an ONNX-in recipe cut at the classifier's input, training from
    the last convolution: the recipe's path."""
    _export(how, folder / "model_in.onnx")
    graph = onnx.load(str(folder / "model_in.onnx")).graph
    inits = {i.name for i in graph.initializer}
    classifier = [n for n in graph.node if n.op_type in ("Gemm", "MatMul")][-1]
    cut = next(i for i in classifier.input if i not in inits)
    last_conv = [n.name for n in graph.node if n.op_type == "Conv"][-1]
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("test", 16)):
        x = rng.standard_normal((n, 3, SIZE, SIZE)).astype(np.float32)
        np.savez(
            folder / f"{split}.npz",
            x=x,
            y=(x[:, 0].mean((1, 2)) > 0).astype(np.int64) + (x[:, 1].mean((1, 2)) > 0),
        )
    text = RECIPE.format(how=how, cut=cut, size=SIZE, classes=CLASSES, last_conv=last_conv)
    if how == "view":
        text = text.replace(f'cut_at = ["{cut}"]\n', "").replace(f"[head]\nnum_classes = {CLASSES}\n", "")
    (folder / "recipe.toml").write_text(text)
    return folder / "recipe.toml"


@pytest.fixture(scope="module", params=EXPORTS)
def prepared_onnx_in(request, tmp_path_factory, no_ort_training):
    """(how, recipe, Prepared) of each export prepared for the autograd runtime."""
    folder = tmp_path_factory.mktemp(f"onnx_in_{request.param}")
    recipe_file = _write(folder, request.param)
    recipe, prepared = prepared_by_odl(recipe_file, {}, folder / "prepared", no_ort_training)
    return request.param, recipe, prepared


def _arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def test_the_twin_computes_what_model_onnx_computes(prepared_onnx_in):
    how, _, prepared = prepared_onnx_in
    graph = onnx.load(str(prepared.model_onnx))
    assert prepared.manifest["runtime"] == "autograd"
    if how == "bn-kept":  # the user's BatchNorm nodes and statistics are what model.onnx holds
        assert sum(n.op_type == "BatchNormalization" for n in graph.graph.node) == 2
    twin, held = torch_twin(graph, prepared.manifest["trainable"])
    assert set(held) == set(prepared.manifest["trainable"])
    x = np.random.default_rng(1).standard_normal((5, 3, SIZE, SIZE)).astype(np.float32)
    (want,) = onnxruntime.InferenceSession(str(prepared.model_onnx)).run(None, {"input": x})
    with torch.no_grad():
        got = twin(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_each_gradient_equals_pytorch_s_on_the_twin(prepared_onnx_in):
    _, recipe, prepared = prepared_onnx_in
    step = json.loads((prepared.artifacts_dir / "step.json").read_text())
    trainable = [t["name"] for t in step["trainable"]]
    assert (
        trainable == prepared.manifest["trainable"] and len(trainable) >= 4
    )  # the last conv and the classifier
    twin, held = torch_twin(onnx.load(str(prepared.model_onnx)), trainable)
    tensors = dict(twin.named_parameters())
    with np.load(prepared.artifacts_dir / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    session = onnxruntime.InferenceSession(str(prepared.artifacts_dir / "train_step.onnx"))
    data = np.load(recipe.data.train)
    for batch in (1, 5, 8):
        x, y = data["x"][:batch], data["y"][:batch]
        got = session.run(None, {"input": x, "labels": y, **weights})
        twin.zero_grad()
        loss = F.cross_entropy(twin.eval()(torch.from_numpy(x)), torch.from_numpy(y))  # BatchNorm frozen
        loss.backward()
        assert abs(got[0] - loss.item()) <= 1e-5 * max(1.0, abs(loss.item()))
        for name, grad in zip(trainable, got[2:], strict=True):
            want = sum(tensors[t].grad.numpy() for t in held[name])  # a shared tensor: its uses' sum
            assert np.abs(grad - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), (batch, name)


def test_the_agent_trains_it_and_only_trainable_tensors_change(
    prepared_onnx_in, agent_board, no_ort_training
):
    how, recipe, prepared = prepared_onnx_in
    spec, files = build_job_spec(recipe, prepared, f"onnx-in-{how}")
    spec = replace(spec, train=replace(spec.train, max_steps=STEPS, log_every=1))
    jdir, result = run_job(agent_board, spec, files, env=no_ort_training)
    losses = step_losses(jdir)
    assert result["steps"] == len(losses) == STEPS and np.isfinite(losses).all()
    trained, adapted = onnx.load(str(jdir / "inference.onnx")), onnx.load(str(prepared.model_onnx))
    assert [(n.op_type, list(n.input), list(n.output)) for n in trained.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in adapted.graph.node
    ]
    after, before = _arrays(trained), _arrays(adapted)
    assert after.keys() == before.keys()
    trainable = set(prepared.manifest["trainable"])
    for name, value in before.items():
        if name in trainable:
            assert not np.array_equal(after[name], value), name
        else:
            assert after[name].tobytes() == value.tobytes(), name
    user = _arrays(onnx.load(str(Path(recipe.model.ref))))  # the user's own tensors, where the cut kept them
    assert {n for n in user.keys() & after.keys() if n not in trainable}
    for name in user.keys() & after.keys() - trainable:
        assert after[name].tobytes() == user[name].tobytes(), name


@pytest.mark.ort_training
def test_it_trains_as_the_ort_runtime_does(prepared_onnx_in, agent_board, tmp_path, no_ort_training):
    """The same file and recipe under ``ort-training``: the same step losses and trained tensors."""
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    needs_ort_training()
    how, recipe, prepared = prepared_onnx_in
    ort_recipe = load_recipe(recipe.base_dir / "recipe.toml", {"training.runtime": "ort-training"})
    ort = prepare(ort_recipe, tmp_path / "ort")
    assert ort.manifest["trainable"] == prepared.manifest["trainable"]
    jobs = {}
    for name, (r, p, env) in {
        "autograd": (recipe, prepared, no_ort_training),
        "ort": (ort_recipe, ort, None),
    }.items():
        spec, files = build_job_spec(r, p, f"{name}-{how}")
        spec = replace(spec, train=replace(spec.train, max_steps=STEPS, log_every=1))
        jobs[name] = run_job(agent_board, spec, files, env=env)[0]
    assert_trained_alike(jobs["autograd"], jobs["ort"], STEPS)
