"""Export and training artifacts: every loss kind, every trainable strategy, the BatchNorm fix,
the IR/opset refusal, and a catalogue of bad models each giving its specific error."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest

from tasks.errors import ArtifactError, DataError, ModelError, RecipeError
from tasks.prepare.datasets import ensure_datasets
from tasks.prepare.export.torchscript import export_model
from tasks.prepare.runtimes.ort_training.artifacts import generate
from tests.prepare.kit import TASKS, tiny_recipe


def _prepare(tmp_path, changes=None, loss="cross-entropy", **kw):
    recipe = tiny_recipe(tmp_path, changes, loss=loss)
    ensure_datasets(recipe)
    out = tmp_path / "out"
    return recipe, generate(recipe, export_model(recipe, out), out, **kw), out


def _train_steps(out, arrays, steps=8):
    """Train on one batch with the artifacts (ORT training API); return the losses."""
    from onnxruntime.training import api

    art = out / "artifacts"
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    opt = api.Optimizer(str(art / "optimizer_model.onnx"), module)
    losses = []
    for _ in range(steps):
        out = module(*arrays)  # (loss, *model outputs) for built-in and custom losses
        losses.append(float(np.asarray(out[0] if isinstance(out, tuple) else out).reshape(-1)[0]))
        opt.step()
        module.lazy_reset_grad()
    return losses


@pytest.mark.parametrize("loss", list(TASKS))
def test_builtin_losses_train(tmp_path, loss):
    recipe, manifest, out = _prepare(tmp_path, loss=loss)
    data = np.load(recipe.data.train)
    losses = _train_steps(out, [data["x"][:16], data["y"][:16]])
    assert manifest["loss"] == loss
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_embedded_and_custom_losses(prepared_embedded, prepared_two_head):
    assert prepared_embedded.manifest["loss"] == "embedded"
    assert prepared_embedded.manifest["inference_output_names"] == ["logits"]
    assert prepared_embedded.manifest["feeds"] == {"input": "x", "labels": "y"}
    assert prepared_two_head.manifest["loss"] == "custom:models:two_head_loss"
    assert prepared_two_head.manifest["feeds"] == {"input": "x", "labels": "y", "target": "aux"}
    for p in (prepared_embedded, prepared_two_head):
        repeat = p.validation["repeat_losses"]
        assert p.validation["passed"] and sum(repeat[-3:]) < sum(repeat[:3])


STRATEGIES = [
    ({"strategy": "classifier"}, ["head.weight", "head.bias"]),
    (
        {"strategy": "last-conv+classifier"},  # the BatchNorm right after the conv comes along
        ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "head.weight", "head.bias"],
    ),
    ({"strategy": "all"}, ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "head.weight", "head.bias"]),
    ({"strategy": None, "patterns": ["bn.*"]}, ["bn.weight", "bn.bias"]),
    ({"strategy": None, "names": ["conv.weight"]}, ["conv.weight"]),
]
SIZES = {"conv.weight": 36, "conv.bias": 4, "bn.weight": 4, "bn.bias": 4, "head.weight": 192, "head.bias": 3}


@pytest.mark.parametrize(("trainable", "expected"), STRATEGIES, ids=lambda v: str(v))
def test_trainable_strategies_with_batch_statistics(tmp_path, trainable, expected):
    _, manifest, _ = _prepare(tmp_path, {"trainable": {**trainable, "batchnorm": "batch-stats"}})
    assert sorted(manifest["trainable"]) == sorted(expected)
    assert "bn.running_mean" in manifest["frozen"] and not set(manifest["frozen"]) & set(expected)
    # a trainable conv feeds the BatchNorm, whose running statistics ORT training never updates
    stale_bn = [w for w in manifest["warnings"] if "BatchNorm" in w]
    assert bool(stale_bn) == ("conv.weight" in expected), manifest["warnings"]
    assert manifest["trainable_count"] == sum(SIZES[n] for n in expected)
    assert manifest["frozen_count"] == sum(SIZES.values()) + 8 - manifest["trainable_count"]


@pytest.mark.parametrize(("trainable", "expected"), STRATEGIES, ids=lambda v: str(v))
def test_trainable_strategies_with_frozen_batchnorm(tmp_path, trainable, expected):
    _, manifest, out = _prepare(tmp_path, {"trainable": trainable})
    assert sorted(manifest["trainable"]) == sorted(expected)
    assert manifest["fixups"] == {"batchnorm_frozen": 1} and not manifest["warnings"]
    ops = {n.op_type for n in onnx.load(str(out / "artifacts" / "training_model.onnx")).graph.node}
    assert "BatchNormalization" not in ops and "BatchNormInternal" not in ops
    # running statistics folded into two constants of 4 channels; the affine stays when trained
    assert not {"bn.running_mean", "bn.running_var"} & set(manifest["frozen"])
    bn_kept = 8 if "bn.weight" in expected else 0
    assert manifest["frozen_count"] == sum(SIZES.values()) - 8 + bn_kept + 8 - manifest["trainable_count"]


def test_conv_classifier_strategy(tmp_path):
    """A classifier that ends in a Conv (as SqueezeNet's) is the 'classifier' strategy's layer."""
    _, manifest, _ = _prepare(tmp_path, {"model": {"callable": "tinymodels:conv_only"}})
    assert manifest["trainable"] == ["conv.weight", "conv.bias"]


@pytest.mark.slow
def test_last_conv_found_in_mobilenet_graph(prepared_mobilenet):
    """The walk finds mobilenet_v2's last 1x1 conv (features.18.0) without exporter-made names."""
    assert prepared_mobilenet.manifest["trainable"] == [
        "features.18.0.weight",
        "features.18.1.weight",
        "features.18.1.bias",
        "classifier.1.weight",
        "classifier.1.bias",
    ]
    assert prepared_mobilenet.manifest["trainable_count"] == 320 * 1280 + 2 * 1280 + 1280 * 2 + 2
    assert prepared_mobilenet.validation["passed"]


def test_batchnorm_fix_is_needed(tmp_path):
    """Without the fix eval_model.onnx does not load; with it, it does (same recipe)."""
    from onnxruntime.training import api

    recipe, _, out = _prepare(tmp_path, {"trainable": {"batchnorm": "batch-stats"}}, bn_fix=False)
    art = out / "artifacts"
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    with pytest.raises(Exception, match="op outputs should be 1"):
        api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    generate(recipe, out / "model.onnx", out)
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))


def _rewrite(src, dst, ir=None, opset=None):
    model = onnx.load(str(src))
    if ir is not None:
        model.ir_version = ir
    if opset is not None:
        model.opset_import[0].version = opset
    onnx.save(model, str(dst))
    return dst


@pytest.mark.parametrize(("ir", "opset", "match"), [(11, None, "IR version 11"), (None, 22, "opset 22")])
def test_refuses_what_the_board_cannot_load(tmp_path, ir, opset, match):
    recipe, _, out = _prepare(tmp_path)
    bad = _rewrite(out / "model.onnx", tmp_path / "new.onnx", ir=ir, opset=opset)
    with pytest.raises(ArtifactError, match=match):
        generate(recipe, bad, tmp_path / "out2")


def test_onnx_recipe_loads_and_checks(tmp_path):
    """A training-mode ONNX file goes through unchanged: same nodes, same weights."""
    import onnx

    recipe, manifest, out = _prepare(tmp_path)
    shutil.copy(out / "model.onnx", tmp_path / "given.onnx")
    onnx_recipe = tiny_recipe(tmp_path, {"model": {"callable": None, "onnx": "given.onnx"}})
    target = export_model(onnx_recipe, tmp_path / "out3")
    given, adapted = onnx.load(str(tmp_path / "given.onnx")), onnx.load(str(target))
    assert [n.SerializeToString() for n in adapted.graph.node] == [
        n.SerializeToString() for n in given.graph.node
    ]
    assert [i.SerializeToString() for i in adapted.graph.initializer] == [
        i.SerializeToString() for i in given.graph.initializer
    ]
    assert generate(onnx_recipe, target, tmp_path / "out3")["trainable"] == manifest["trainable"]


def _truncated(tmp_path):
    data = (tmp_path / "good.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    return {"model": {"callable": None, "onnx": "cut.onnx"}}


BAD_MODELS = [  # (recipe change, loss, error type, text in the message)
    (
        {"trainable": {"strategy": None, "patterns": ["fc.*"]}},
        "cross-entropy",
        RecipeError,
        "trainable.patterns",
    ),
    (
        {"trainable": {"strategy": None, "names": ["bn.running_var"]}},
        "cross-entropy",
        RecipeError,
        "running statistics",
    ),
    ({"trainable": {"names": ["head.wieght"]}}, "cross-entropy", RecipeError, "trainable.names"),
    (
        {"model": {"callable": "tinymodels:two_out", "output_names": ["a", "b"]}},
        "mse",
        RecipeError,
        "custom or embedded loss for a model with 2 outputs",
    ),
    ({"model": {"callable": "tinymodels:two_out"}}, "mse", RecipeError, "model.output_names"),
    ({"model": {"input_shape": [1, 5, 5]}}, "cross-entropy", RecipeError, "model.input_shape"),
    ({"model": {"callable": "tinymodels:scale_only"}}, "cross-entropy", RecipeError, "Gemm, MatMul or Conv"),
    ({"model": {"callable": "tinymodels:nothing"}}, "cross-entropy", RecipeError, "model.callable"),
    ({"model": {"callable": "nosuchmodule:tiny"}}, "cross-entropy", RecipeError, "importable module"),
    ({"model": {"kwargs": {"depth": 3}}}, "cross-entropy", RecipeError, "model.kwargs"),
    ({"model": {"weights": "missing.pt"}}, "cross-entropy", DataError, "model.weights"),
    ({"data": {"make": None, "train": "nowhere.npz"}}, "cross-entropy", DataError, "data.train"),
    ({"loss": {"kind": "custom:tinymodels:tiny"}}, "cross-entropy", RecipeError, "onnxblock.Block"),
    ({"model": {"callable": None, "onnx": "absent.onnx"}}, "cross-entropy", RecipeError, "model.onnx"),
    (_truncated, "cross-entropy", ModelError, "not a valid ONNX model"),
]


@pytest.mark.parametrize(("change", "loss", "error", "text"), BAD_MODELS, ids=[str(b[3]) for b in BAD_MODELS])
def test_bad_models(tmp_path, change, loss, error, text):
    if callable(change):
        _prepare(tmp_path)
        shutil.copy(tmp_path / "out" / "model.onnx", tmp_path / "good.onnx")
        change = change(tmp_path)
    with pytest.raises(error, match=text):
        _prepare(tmp_path, change, loss=loss)


def test_cross_entropy_needs_num_classes_outputs(tmp_path):
    recipe, _, out = _prepare(tmp_path)
    other = tiny_recipe(tmp_path, {"model": {"num_classes": 5, "onnx": "out/model.onnx", "callable": None}})
    with pytest.raises(RecipeError, match=r"num_classes=5"):
        generate(other, out / "model.onnx", tmp_path / "o2")
