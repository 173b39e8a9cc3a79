"""Transfer learning from an ONNX model the user did not train (tasks.prepare.export.onnx_in): the cut,
the new head, train_from, BatchNorm folded into the convolutions, opset conversion, external data,
and a one-line error for every bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.errors import ArtifactError, ModelError, RecipeError
from tasks.paths import PROJECT_ROOT

RECIPE = PROJECT_ROOT / "recipes" / "digits_onnx.toml"
CUT = "/Flatten_output_0"


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """The recipe's data folder (digits + the foreign eval-mode export), made once."""
    from tasks.prepare.datasets import ensure_datasets
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(RECIPE, _on_this_host())
    ensure_datasets(recipe)
    return recipe


def _on_this_host() -> dict:
    """ORT-training where this host prepares it, else autograd (Python >= 3.12 has no
    onnxruntime-training): the adaptation of the ONNX file is the same under both."""
    from tasks.recipe.host_runtime import why_no_ort_training

    return {"training.runtime": "ort-training" if why_no_ort_training() is None else "autograd"}


def _recipe(overrides=None):
    from tasks.recipe.load import load_recipe

    return load_recipe(RECIPE, _on_this_host() | (overrides or {}))


def _adapt(recipe, tmp_path) -> onnx.ModelProto:
    from tasks.prepare.export.onnx_in import adapt_onnx

    return onnx.load(str(adapt_onnx(recipe, tmp_path / "model.onnx")))


def _run(model: onnx.ModelProto | Path, x: np.ndarray, outputs: list[str] | None = None) -> list[np.ndarray]:
    import onnxruntime as ort

    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(outputs, {"input": x})


def test_cut_and_head_compute_the_new_head_on_the_foreign_features(foreign, tmp_path):
    """The adapted model = the foreign model up to the cut tensor, then Linear+ReLU+Linear with the
    head's seeded weights; its batch axis is dynamic although the foreign export fixed it to 1."""
    model = _adapt(foreign, tmp_path)
    assert [o.name for o in model.graph.output] == ["logits"]
    assert not any(n.name == "/fc/Gemm" for n in model.graph.node)  # the old classifier is gone
    x = np.load(foreign.data.test)["x"][:5]
    (logits,) = _run(model, x)
    original = onnx.load(str(foreign.model.ref))
    original.graph.output.append(helper.make_tensor_value_info(CUT, TensorProto.FLOAT, None))
    features = np.concatenate([_run(original, x[i : i + 1], [CUT])[0] for i in range(len(x))])
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    hidden = np.maximum(features @ w["head.hidden.weight"].T + w["head.hidden.bias"], 0)
    np.testing.assert_allclose(
        logits, hidden @ w["head.out.weight"].T + w["head.out.bias"], rtol=1e-4, atol=1e-5
    )
    bound = 1 / np.sqrt(512)  # torch.nn.Linear's initialisation range for 512 inputs
    assert np.abs(w["head.hidden.weight"]).max() <= bound and w["head.hidden.weight"].std() > bound / 3
    again = _adapt(foreign, tmp_path / "again")  # the seed makes the head reproducible
    np.testing.assert_array_equal(numpy_helper.to_array(again.graph.initializer[-1]), w["head.out.bias"])


def test_train_from_freezes_everything_before_it_and_bn_is_folded(foreign, tmp_path):
    from tasks.prepare.trainable import resolve_trainable

    model = _adapt(foreign, tmp_path)
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)  # folded by the exporter
    conv1, conv2 = (n for n in model.graph.node if n.op_type == "Conv")
    trainable, frozen, _ = resolve_trainable(foreign, model)
    assert set(conv2.input[1:]) <= set(trainable) and set(conv1.input[1:]) <= set(frozen)
    assert all(name.startswith("onnx::Conv_") for name in conv2.input[1:])  # the wiki's names
    assert {"head.hidden.weight", "head.out.bias"} <= set(trainable)
    # with a tensor instead of a node, and combined with a pattern: only what lies after it
    by_tensor = _recipe({"trainable.train_from": "/Relu_1_output_0"})
    assert resolve_trainable(by_tensor, model)[0] == [
        "head.hidden.weight",
        "head.hidden.bias",
        "head.out.weight",
        "head.out.bias",
    ]
    both = _recipe({"trainable.patterns": ["head.out.*", "onnx::Conv_*"]})
    assert set(resolve_trainable(both, model)[0]) == {"head.out.weight", "head.out.bias", *conv2.input[1:]}
    before = _recipe({"trainable.patterns": ["onnx::Conv_*"], "trainable.train_from": "/Relu_1_output_0"})
    with pytest.raises(RecipeError, match="lie before it"):
        resolve_trainable(before, model)


def test_the_adapted_recipe_prepares_and_validates(foreign, tmp_path):
    from tasks.prepare.pipeline import prepare

    done = prepare(foreign, tmp_path / "out")
    assert done.validation["passed"] and done.validation["checks"]["loss_falls"]
    assert done.manifest["trainable"][-1] == "head.out.bias"


def _export_at(opset: int, path: Path) -> Path:
    import sys

    import torch

    sys.path.insert(0, str(PROJECT_ROOT / "recipes"))
    try:
        from datasets import export_foreign
        from models import digits_cnn
    finally:
        sys.path.remove(str(PROJECT_ROOT / "recipes"))
    torch.manual_seed(0)
    return export_foreign(digits_cnn(10), torch.zeros(1, 1, 8, 8), path, opset=opset)


@pytest.mark.parametrize(("opset", "expected"), [(11, 17), (13, 13), (21, 21)])
def test_opsets_outside_13_21_are_converted(tmp_path, opset, expected):
    from tasks.prepare.export.onnx_in import opset_of

    path = _export_at(opset, tmp_path / f"m{opset}.onnx")
    recipe = _recipe({"model.onnx": str(path)})
    assert opset_of(_adapt(recipe, tmp_path)) == expected


def test_external_data_files_are_read_and_a_missing_one_is_named(foreign, tmp_path):
    model = onnx.load(str(foreign.model.ref))
    ext = tmp_path / "ext" / "model.onnx"
    ext.parent.mkdir()
    onnx.save_model(model, str(ext), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)  # fmt: skip
    assert (ext.parent / "weights.bin").is_file()
    adapted = _adapt(_recipe({"model.onnx": str(ext)}), tmp_path)
    assert not any(i.data_location == TensorProto.EXTERNAL for i in adapted.graph.initializer)
    (ext.parent / "weights.bin").unlink()
    with pytest.raises(ModelError, match="weights.bin"):
        _adapt(_recipe({"model.onnx": str(ext)}), tmp_path)


def _tiny(tmp_path: Path, body: str = "Floor", ir: int = 8, opset: int = 13) -> Path:
    """input [N, 4] -> Gemm -> <body> -> Gemm -> out, with weights."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
             for n, s in (("w1", (4, 4)), ("b1", (4,)), ("w2", (3, 4)), ("b2", (3,)))]  # fmt: skip
    nodes = [
        helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], name="g1", transB=1),
        helper.make_node(body, ["h"], ["r"], name="mid"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["out"], name="g2", transB=1),
        helper.make_node("ReduceSum", ["out"], ["total"], name="sum", keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    path = tmp_path / f"tiny-{body}-{ir}-{opset}.onnx"
    onnx.save(model, str(path))
    return path


def _tiny_recipe(path: Path, **over):
    values = {"model.onnx": str(path), "model.input_shape": [4], "model.cut_at": ["out"],
              "head.num_classes": 2, "head.hidden": 0, "trainable.train_from": "g1",
              "data.feeds": {}, "quantize": {}}  # fmt: skip
    values.update(over)
    return _recipe(values)


def test_a_newer_opset_than_the_board_runs_is_converted_down(tmp_path):
    from tasks.prepare.export.onnx_in import opset_of

    assert opset_of(_adapt(_tiny_recipe(_tiny(tmp_path, "Relu", ir=10, opset=22)), tmp_path)) == 21


def test_bad_inputs_are_one_line_errors_naming_the_field(tmp_path):
    from tasks.prepare.trainable import resolve_trainable

    relu = _tiny(tmp_path, "Relu")
    with pytest.raises(RecipeError) as info:
        _adapt(_tiny_recipe(relu, **{"model.cut_at": ["nowhere"]}), tmp_path)
    assert info.value.field == "model.cut_at" and "'out'" in str(info.value)
    with pytest.raises(RecipeError) as info:  # a scalar cannot take a Linear head
        _adapt(_tiny_recipe(relu, **{"model.cut_at": ["total"]}), tmp_path)
    assert info.value.field == "head"
    model = _adapt(_tiny_recipe(relu), tmp_path)
    with pytest.raises(RecipeError) as info:
        resolve_trainable(_tiny_recipe(relu, **{"trainable.train_from": "g9"}), model)
    assert info.value.field == "trainable.train_from"
    with pytest.raises(ModelError, match="IR version 11"):
        _adapt(_tiny_recipe(_tiny(tmp_path, "Relu", ir=11)), tmp_path)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(relu.read_bytes()[:100])
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        _adapt(_tiny_recipe(broken), tmp_path)


@pytest.mark.ort_training  # ORT's gradient builder's refusal
def test_an_op_without_gradient_after_train_from_is_named(tmp_path):
    """Floor has no gradient in ORT 1.19.2: training from g1 must differentiate through it."""
    from tasks.prepare.runtimes.ort_training.artifacts import generate

    path = _tiny(tmp_path, "Floor")
    recipe = _tiny_recipe(path, **{"loss.kind": "cross-entropy"})
    model = _adapt(recipe, tmp_path)
    onnx.save(model, str(tmp_path / "model.onnx"))
    with pytest.raises(ArtifactError) as info:
        generate(recipe, tmp_path / "model.onnx", tmp_path / "out")
    assert "Floor" in str(info.value) and "\n" not in str(info.value)
    # training after the Floor is fine
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    generate(_tiny_recipe(path, **{"trainable.train_from": "g2"}), tmp_path / "model.onnx", tmp_path / "out")


@pytest.mark.slow
@pytest.mark.ort_training  # the recipe's runtime; tests/runtimes/test_autograd_onnx_in.py has a BN-folded export
def test_the_wiki_case_from_an_eval_mode_mobilenet_v2_export(tmp_path):
    """recipes/mobilenet_v2_onnx.toml: torchvision mobilenet_v2 exported as the wiki's section 4.1
    does (BN folded), cut before its classifier, a 2-class head; the last conv trains under the
    names the wiki shows (onnx::Conv_691 / 692), everything before it stays frozen."""
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(
        PROJECT_ROOT / "recipes" / "mobilenet_v2_onnx.toml", {"training.runtime": "ort-training"}
    )
    done = prepare(recipe, tmp_path / "out")
    assert done.manifest["trainable"] == [
        "onnx::Conv_691",
        "onnx::Conv_692",
        "head.out.weight",
        "head.out.bias",
    ]
    assert done.validation["passed"]
    model = onnx.load(str(done.model_onnx))
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)
    assert [n.op_type for n in model.graph.node[-3:]] == ["GlobalAveragePool", "Flatten", "Gemm"]
