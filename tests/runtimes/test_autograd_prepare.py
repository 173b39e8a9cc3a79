"""The autograd runtime's preparation of the digits recipe, made with ``onnxruntime.training``
unimportable: the manifest the rest of the pipeline reads, the step files as step.json describes
them, and each gradient of the train step equal to PyTorch's own autograd."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import torch
import torch.nn.functional as F

from tasks.prepare.export.torch_model import build_model
from tests.fixtures_prepare import needs_ort_training
from tests.runtimes.kit import odl

GRAD_TOL = 1e-5


def test_preparation_needs_no_onnxruntime_training(autograd_digits, no_ort_training):
    _, prepared = autograd_digits
    assert prepared.validation["passed"]
    assert prepared.manifest["runtime"] == "autograd"
    needs_ort_training()
    # the blocker itself works: the ORT runtime cannot prepare in the same process tree
    proc = odl(["artifacts", "recipes/digits.toml", "--model", str(prepared.model_onnx), "--out",
                str(prepared.out_dir.parent / "ort"), "--set", 'training.runtime="ort-training"'], no_ort_training)  # fmt: skip
    assert proc.returncode != 0 and "onnxruntime.training is blocked" in proc.stderr


def test_the_manifest_has_the_ort_path_s_keys(autograd_digits, prepared_digits):
    _, prepared = autograd_digits
    manifest, ort = prepared.manifest, prepared_digits.manifest
    assert set(ort) - set(manifest) == set()
    for key in (
        "trainable",
        "feeds",
        "input_names",
        "output_names",
        "inference_output_names",
        "loss",
        "trainable_count",
    ):
        assert manifest[key] == ort[key], key
    assert set(manifest["files"]) == {
        "train_step",
        "eval_step",
        "step",
        "checkpoint",
        "inference_template",
        "model",
    }
    cache, ort_cache = manifest["prefix_cache"], ort["prefix_cache"]  # the frozen conv1 + ReLU in both
    assert cache["enabled"] and ort_cache["enabled"] and cache["feature_shape"] == ort_cache["feature_shape"]
    assert set(cache["files"]) == {*manifest["files"], "prefix_model"} - {"model"}
    assert (
        cache["files"]["checkpoint"] == manifest["files"]["checkpoint"]
    )  # the split trains the same tensors


def test_step_files_are_what_step_json_says(autograd_digits):
    _, prepared = autograd_digits
    step = json.loads((prepared.artifacts_dir / "step.json").read_text())
    trainable = [t["name"] for t in step["trainable"]]
    assert trainable == prepared.manifest["trainable"]
    assert step["optimizer"] == {
        "kind": "adamw",
        "lr": 1e-3,
        "betas": [0.9, 0.999],
        "eps": 1e-6,
        "weight_decay": 0.01,
    }
    train = onnx.load(str(prepared.artifacts_dir / "train_step.onnx"))
    assert [i.name for i in train.graph.input] == [f["name"] for f in step["feeds"]] + trainable
    assert [o.name for o in train.graph.output] == ["loss", "logits", *(f"{n}_grad" for n in trainable)]
    assert step["outputs"] == ["loss", "logits"] and step["gradients"] == [f"{n}_grad" for n in trainable]
    frozen = {i.name for i in train.graph.initializer}
    assert not frozen & set(trainable)
    assert (
        max(o.version for o in train.opset_import if o.domain in ("", "ai.onnx")) <= 21
        and train.ir_version <= 10
    )
    with np.load(prepared.artifacts_dir / "checkpoint.npz") as ckpt:
        assert list(ckpt.files) == trainable


def _torch_step(recipe, x: np.ndarray, y: np.ndarray):
    """Loss, logits and gradients of the trainable parameters by PyTorch's autograd, BatchNorm on its
    running statistics (trainable.batchnorm = "frozen") and every other layer in training mode."""
    model = build_model(recipe).train()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    logits = model(torch.from_numpy(x))
    loss = F.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()
    return loss.item(), logits.detach().numpy(), {n: p.grad.numpy() for n, p in model.named_parameters()}


def test_each_gradient_equals_pytorch_s(autograd_digits):
    recipe, prepared = autograd_digits
    step = json.loads((prepared.artifacts_dir / "step.json").read_text())
    data = np.load(recipe.data.train)
    session = onnxruntime.InferenceSession(str(prepared.artifacts_dir / "train_step.onnx"))
    with np.load(prepared.artifacts_dir / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    for batch in (1, 5, 32):
        rows = np.random.default_rng(batch).choice(len(data["x"]), batch, replace=False)
        x, y = data["x"][rows], data["y"][rows].astype(np.int64)
        got = session.run(None, {"input": x, "labels": y, **weights})
        loss, logits, grads = _torch_step(recipe, x, y)
        assert abs(got[0] - loss) <= GRAD_TOL * max(1, abs(loss))
        np.testing.assert_allclose(got[1], logits, atol=GRAD_TOL)
        for name, grad in zip(step["trainable"], got[2:], strict=True):
            want = grads[name["name"]]
            assert np.abs(grad - want).max() <= GRAD_TOL * max(1.0, np.abs(want).max()), (batch, name["name"])
