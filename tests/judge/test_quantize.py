"""Static int8 QDQ quantization of the prepared digits model with ONNX Runtime's real quantizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tasks.errors import DataError, EvaluationError, RecipeError
from tasks.judge.evaluate import evaluate
from tasks.judge.quantize import fixed_batch, int8_verdict, quantize_int8
from tasks.judge.runtime import session
from tasks.paths import PROJECT_ROOT
from tasks.recipe.extras import QuantizeSpec

DIGITS = PROJECT_ROOT / "recipes" / "data" / "digits"


@pytest.fixture(scope="module")
def float_model(prepared_digits) -> Path:
    from tasks.stages.judge import base_model

    return base_model(prepared_digits)


@pytest.fixture(scope="module")
def float_metrics(float_model) -> dict:
    return evaluate(float_model, DIGITS / "test.npz", "classification")


def _ops(model: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(model)).graph.node]


def _batch_dims(model: Path) -> list[int | str]:
    graph = onnx.load(str(model)).graph
    return [v.type.tensor_type.shape.dim[0].dim_value for v in [*graph.input, *graph.output]]


def test_int8_model_is_qdq_batch1_smaller_and_as_accurate(float_model, float_metrics, tmp_path):
    spec = QuantizeSpec(DIGITS / "train.npz", "minmax", per_channel=True, samples=128, max_drop=0.05)
    result = quantize_int8(float_model, spec, tmp_path / "int8.onnx")
    int8 = Path(result["path"])
    assert int8 == tmp_path / "int8.onnx" and result["size_bytes"] == int8.stat().st_size
    assert result["float_size_bytes"] == float_model.stat().st_size > result["size_bytes"]
    assert (result["method"], result["per_channel"], result["samples"]) == ("minmax", True, 128)
    ops = _ops(int8)
    assert result["quantize_linear"] == ops.count("QuantizeLinear") > 0
    assert result["dequantize_linear"] == ops.count("DequantizeLinear") > 0
    sess = session(int8)
    assert sess.get_inputs()[0].shape[0] == 1 and _batch_dims(int8) == [1, 1]
    weights = {i.name: i.data_type for i in onnx.load(str(int8)).graph.initializer}
    assert TensorProto.INT8 in weights.values()  # int8 weights, not float ones beside QDQ pairs
    metrics = evaluate(int8, DIGITS / "test.npz", "classification", batch_size=1)
    assert abs(metrics["accuracy"] - float_metrics["accuracy"]) <= 0.05
    verdict = int8_verdict(float_metrics, metrics, "accuracy", spec.max_drop)
    assert verdict["holds"] and verdict["int8"] == metrics["accuracy"]


@pytest.mark.parametrize(
    ("method", "per_channel", "samples", "used"),
    [("entropy", False, 32, 32), ("percentile", True, 10**6, 197)],  # the test set holds 197
)
def test_histogram_methods_on_the_test_set(
    float_model, float_metrics, tmp_path, method, per_channel, samples, used
):
    spec = QuantizeSpec(DIGITS / "test.npz", method, per_channel=per_channel, samples=samples)
    result = quantize_int8(float_model, spec, tmp_path / "int8.onnx")
    assert (result["method"], result["per_channel"], result["samples"]) == (method, per_channel, used)
    metrics = evaluate(Path(result["path"]), DIGITS / "test.npz", "classification", batch_size=1)
    assert abs(metrics["accuracy"] - float_metrics["accuracy"]) <= 0.05


def test_fixed_batch_sets_dim0_of_inputs_and_outputs(float_model, tmp_path):
    out = fixed_batch(float_model, tmp_path / "b4.onnx", batch=4)
    assert _batch_dims(out) == [4, 4]
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    x = np.load(DIGITS / "test.npz")["x"][:4]
    assert session(out).run(None, {"input": x})[0].shape == (4, 10)


def _model(tmp_path: Path, target_shape: list[int], n_inputs: int = 1) -> Path:
    """A Reshape model (x: [N, 4]) reshaping to ``target_shape``; extra inputs are added to x."""
    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, ["N", 4]) for i in range(n_inputs)]
    nodes = [helper.make_node("Add", ["x0", f"x{i}"], [f"x{i}_sum"]) for i in range(1, n_inputs)]
    last = f"x{n_inputs - 1}_sum" if n_inputs > 1 else "x0"
    nodes.append(helper.make_node("Reshape", [last, "shape"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", None])],
        [helper.make_tensor("shape", TensorProto.INT64, [len(target_shape)], target_shape)],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_fixed_batch_refuses_a_graph_that_cannot_run_at_that_batch(tmp_path):
    with pytest.raises(EvaluationError, match="batch fixed to 1"):
        fixed_batch(_model(tmp_path, [2, -1]), tmp_path / "b1.onnx")


def test_quantize_refuses_a_model_with_two_inputs(tmp_path):
    spec = QuantizeSpec(DIGITS / "test.npz")
    with pytest.raises(EvaluationError, match=r"quantize.calibration's x, the model has 2"):
        quantize_int8(_model(tmp_path, [-1, 4], n_inputs=2), spec, tmp_path / "int8.onnx")


def _npz(tmp_path: Path, **arrays) -> Path:
    path = tmp_path / "calib.npz"
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: d / "missing.npz", "file not found"),
        (lambda d: _npz(d, y=np.zeros(3)), r"expected an array 'x'.*\['y'\]"),
        (lambda d: _npz(d, x=np.zeros((3, 1, 8, 7), np.float32)), r"shape \(1, 8, 7\).*expects \(1, 8, 8\)"),
        (lambda d: _npz(d, x=np.zeros((3, 8, 8), np.float32)), r"shape \(8, 8\).*expects \(1, 8, 8\)"),
        (lambda d: _npz(d, x=np.zeros((0, 1, 8, 8), np.float32)), "no samples"),
        (lambda d: _npz(d, x=np.full((3, 1, 8, 8), np.nan, np.float32)), "NaN"),
        (lambda d: (d / "text.npz").write_text("x") and d / "text.npz", "not a readable .npz"),
    ],
    ids=["missing", "no-x", "sample-shape", "rank", "empty", "nan", "not-npz"],
)
def test_calibration_errors_name_the_field(float_model, tmp_path, make, match):
    out = tmp_path / "int8.onnx"
    with pytest.raises(DataError, match=match) as err:
        quantize_int8(float_model, QuantizeSpec(make(tmp_path)), out)
    assert str(err.value).startswith("quantize.calibration: ") and not out.exists()


def test_unknown_method_is_a_recipe_error(float_model, tmp_path):
    with pytest.raises(RecipeError, match="quantize.method"):
        quantize_int8(float_model, QuantizeSpec(DIGITS / "test.npz", method="kl"), tmp_path / "q.onnx")


def test_verdict_on_a_higher_is_better_metric():
    v = int8_verdict({"accuracy": 0.90}, {"accuracy": 0.88}, "accuracy", 0.05)
    assert v["holds"] and v["drop"] == pytest.approx(0.02) and (v["float"], v["int8"]) == (0.90, 0.88)
    assert v["reason"].endswith("within quantize.max_drop 0.0500") and "0.0200 below" in v["reason"]
    v = int8_verdict({"accuracy": 0.90}, {"accuracy": 0.88}, "accuracy", 0.01)
    assert not v["holds"] and "beyond quantize.max_drop" in v["reason"]
    v = int8_verdict({"accuracy": 0.90}, {"accuracy": 0.93}, "accuracy", 0.0)
    assert v["holds"] and v["drop"] == pytest.approx(-0.03) and "0.0300 above" in v["reason"]
    v = int8_verdict({"accuracy": 0.90}, {"accuracy": 0.10}, "accuracy", None)
    assert v["holds"] and v["max_drop"] is None and "no quantize.max_drop" in v["reason"]


@pytest.mark.parametrize("metric", ["loss", "mse", "mae"])
def test_verdict_on_a_lower_is_better_metric(metric):
    v = int8_verdict({metric: 0.30}, {metric: 0.36}, metric, 0.05)
    assert not v["holds"] and v["drop"] == pytest.approx(0.06) and "0.0600 above" in v["reason"]
    v = int8_verdict({metric: 0.30}, {metric: 0.27}, metric, 0.0)
    assert v["holds"] and v["drop"] == pytest.approx(-0.03) and "0.0300 below" in v["reason"]


def test_verdict_names_a_missing_metric():
    with pytest.raises(EvaluationError, match=r"metric 'map50': the int8 model's .*\['accuracy'\]"):
        int8_verdict({"map50": 0.5}, {"accuracy": 0.9}, "map50", 0.01)
    with pytest.raises(EvaluationError, match="metric 'accuracy': the float model's"):
        int8_verdict({"accuracy": "n/a"}, {"accuracy": 0.9}, "accuracy", 0.01)
