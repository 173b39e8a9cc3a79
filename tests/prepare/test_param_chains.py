"""A layer's weight and bias read through chains of views (tasks.prepare.rewrites.param_chains): selected
with the layer, made initializers the board trains, trained by ORT; a parameter left out of both
sets, or one the board cannot load, is one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tasks.errors import ModelError
from tests.prepare.chain_kit import CHAIN_OPS, chained_model, chained_recipe, train_steps


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    from tasks.prepare.graph import quiet_session

    return quiet_session(model).run(None, {"input": x})[0]


def _prepare_artifacts(model: onnx.ModelProto, layer: str, tmp_path, **over):
    """adapt_onnx + generate on ``model`` saved as a foreign file: (adapted model, manifest)."""
    from tasks.prepare.export.onnx_in import adapt_onnx
    from tasks.prepare.runtimes.ort_training.artifacts import generate

    path = tmp_path / "foreign.onnx"
    onnx.save(model, str(path))
    recipe = chained_recipe(path, layer, **over)
    adapted = adapt_onnx(recipe, tmp_path / "model.onnx")
    return onnx.load(str(adapted)), generate(recipe, adapted, tmp_path / "out")


def test_a_bias_through_identity_trains_in_the_real_preparation(tmp_path):
    """The issue's case: an exporter feeds the Conv its bias through an Identity. Prepared and
    validated as `odl prepare` does, the bias trains with the weight: the probe's trained model
    holds another bias than the prepared one."""
    from tasks.prepare.pipeline import prepare

    foreign = chained_model("Conv", [], ["Identity"])
    assert any(n.op_type == "Identity" for n in foreign.graph.node)
    onnx.save(foreign, str(tmp_path / "foreign.onnx"))
    done = prepare(chained_recipe(tmp_path / "foreign.onnx", "Conv"), tmp_path / "out")
    assert done.manifest["trainable"] == ["weight", "bias", "head.out.weight", "head.out.bias"]
    assert set(done.manifest["frozen"]) == {"w1", "b1"} and done.validation["passed"]
    prepared = onnx.load(str(done.model_onnx))
    assert not any(n.op_type == "Identity" for n in prepared.graph.node)  # folded into the Conv
    trained = onnx.load(str(done.out_dir / "validation_inference.onnx"))
    before, after = (
        {i.name: numpy_helper.to_array(i) for i in m.graph.initializer} for m in (prepared, trained)
    )
    assert np.abs(after["bias"] - before["bias"]).max() > 1e-4
    np.testing.assert_array_equal(after["w1"], before["w1"])  # before train_from: frozen


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layer=st.sampled_from(["Conv", "Gemm"]),
    weight_ops=st.lists(st.sampled_from(CHAIN_OPS), max_size=3),
    bias_ops=st.lists(st.sampled_from(CHAIN_OPS), max_size=3),
    constants=st.sets(st.sampled_from(["weight", "bias"])),
)
@example(layer="Conv", weight_ops=["Reshape"], bias_ops=["Cast16"], constants=set())
@example(
    layer="Gemm", weight_ops=["Transpose", "Identity"], bias_ops=["Squeeze", "Unsqueeze"], constants={"bias"}
)
@example(layer="Gemm", weight_ops=["Cast16", "Reshape", "Cast"], bias_ops=["Identity"], constants={"weight"})
def test_chained_parameters_train_with_their_layer(tmp_path_factory, layer, weight_ops, bias_ops, constants):
    """Whatever views stand between a Conv's or Gemm's parameters and the layer, and whether they
    are stored as initializers or Constant nodes: the folded graph computes what the foreign one
    does, both parameters are trainable with train_from the layer, and ORT's training changes both."""
    from tasks.prepare.rewrites.param_chains import fold_parameter_chains

    tmp_path = tmp_path_factory.mktemp("chain")
    foreign = chained_model(layer, weight_ops, bias_ops, tuple(constants))
    folded = onnx.ModelProto()
    folded.CopyFrom(foreign)
    fold_parameter_chains(folded)
    x = np.random.default_rng(1).standard_normal((1, 1, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, x), _run(foreign, x), rtol=1e-6, atol=1e-6)
    assert not any(n.op_type in ("Identity", "Constant", "Cast") for n in folded.graph.node)
    assert all(i.data_type != TensorProto.FLOAT16 for i in folded.graph.initializer)
    _, manifest = _prepare_artifacts(foreign, layer, tmp_path)
    assert {"weight", "bias"} <= set(manifest["trainable"]) and {"w1", "b1"} <= set(manifest["frozen"])
    changed = train_steps(tmp_path / "out" / "artifacts", ["weight", "bias", "w1"])
    assert changed["weight"] > 0 and changed["bias"] > 0 and changed["w1"] == 0


def test_strategies_take_a_classifier_bias_read_through_an_identity():
    """Without folding (a PyTorch export keeps its graph), 'classifier' and 'last-conv+classifier'
    still take the biases their layers read through an Identity or a Cast."""
    from tasks.prepare.trainable import resolve_trainable

    model = chained_model("Conv", ["Identity"], ["Cast", "Identity"])
    for strategy, trains in (("classifier", []), ("last-conv+classifier", ["w1", "b1"])):
        recipe = chained_recipe("unused.onnx", "Conv", trainable={"strategy": strategy})
        assert resolve_trainable(recipe, model)[0] == [*trains, "weight", "bias"]


def test_a_parameter_in_neither_set_is_one_line():
    from tasks.prepare.rewrites.param_chains import check_partition

    model = chained_model("Conv", [], ["Identity"])
    with pytest.raises(ModelError) as info:
        check_partition(model, ["weight"], ["w1", "b1"])
    assert (
        str(info.value)
        == "parameter 'bias' of layer '/layer/Conv' (Conv) is in neither the trainable nor the frozen set"
    )


def test_a_trained_layer_reading_a_constant_bias_is_refused_in_one_line():
    """Unfolded (as a PyTorch export stays), a bias in a Constant node could not train with its
    weight: resolving the trainable set says so instead of training half the layer."""
    from tasks.prepare.trainable import resolve_trainable

    model = chained_model("Gemm", [], ["Identity"], constants=("bias",))
    recipe = chained_recipe("unused.onnx", "Gemm", trainable={"names": ["weight"]})
    with pytest.raises(ModelError, match=r"^layer '/layer/Gemm' \(Gemm\) trains 'weight' but reads 'bias/v0' from "
                                         r"Constant nodes, not from an initializer") as info:  # fmt: skip
        resolve_trainable(recipe, model)
    assert "\n" not in str(info.value)


def test_a_float16_parameter_the_board_cannot_load_is_named():
    """A float16 bias also read by something else than a cast to float stays float16: ORT 1.19.2's
    checkpoint cannot hold it, so adapting the model refuses it in one line naming it and its layer."""
    from tasks.prepare.rewrites.param_chains import check_checkpoint_dtypes, fold_parameter_chains

    model = chained_model("Conv", [], ["Cast16"])
    model.graph.node.append(
        helper.make_node("Cast", ["bias"], ["bias16"], name="/other/Cast", to=TensorProto.FLOAT16)
    )
    model.graph.output.append(helper.make_tensor_value_info("bias16", TensorProto.FLOAT16, [4]))
    assert fold_parameter_chains(model) == {}
    with pytest.raises(ModelError) as info:
        check_checkpoint_dtypes(model, "model.onnx foreign.onnx")
    assert str(info.value).startswith(
        "model.onnx foreign.onnx: initializer 'bias' of layer '/layer/Conv' (Conv) is float16"
    )
    assert "\n" not in str(info.value)


def test_a_bfloat16_bias_cast_to_float_becomes_its_float32_values():
    """bfloat16 is stored as the upper half of a float32: the conversion keeps its values, and the
    folded graph computes what the foreign one does (ORT casts the bfloat16 itself)."""
    from tasks.prepare.rewrites.param_chains import check_checkpoint_dtypes, fold_parameter_chains

    foreign = chained_model("Conv", [], ["Cast"])
    values = [1.5, -2.0, 0.25, 3.0]  # exact in bfloat16
    bias = next(i for i in foreign.graph.initializer if i.name == "bias")
    bias.CopyFrom(helper.make_tensor("bias", TensorProto.BFLOAT16, [4], values))
    folded = onnx.ModelProto()
    folded.CopyFrom(foreign)
    assert fold_parameter_chains(folded) == {"params_cast_to_float32": 1, "identities_folded": 1}
    check_checkpoint_dtypes(folded, "model.onnx foreign.onnx")
    stored = next(i for i in folded.graph.initializer if i.name == "bias")
    np.testing.assert_array_equal(numpy_helper.to_array(stored), np.array(values, np.float32))
    x = np.random.default_rng(2).standard_normal((1, 1, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(folded, x), _run(foreign, x))
