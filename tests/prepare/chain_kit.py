"""Foreign ONNX graphs whose last layer reads its weight and bias through chains of views: a Conv
or Gemm after a frozen Conv, each parameter stored as an initializer or a Constant node and fed to
the layer through Identity, Cast (from float16, or float to float), Reshape, Transpose, Squeeze
and Unsqueeze nodes, as exporters write them. Also a digits-sized ONNX-in recipe for such a file
and a few ORT training steps on prepared artifacts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tasks.paths import PROJECT_ROOT

CHAIN_OPS = ("Identity", "Cast16", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze")
LAYER = "/layer/{op}"  # the node name of the chained layer


def _inverse(op: str, value: np.ndarray, cast_seen: bool) -> tuple[str, np.ndarray, list, dict]:
    """(op actually used, the input it needs to output ``value``, extra constant inputs, attributes)."""
    if op == "Cast16" and not cast_seen:
        return "Cast", value.astype(np.float16), [], {"to": TensorProto.FLOAT}
    if op == "Cast" and value.dtype == np.float32:
        return "Cast", value, [], {"to": TensorProto.FLOAT}
    if op == "Reshape":
        return "Reshape", value.reshape(-1), [np.array(value.shape, np.int64)], {}
    if op == "Transpose" and value.ndim > 1:
        perm = list(range(value.ndim))[::-1]
        return "Transpose", np.ascontiguousarray(value.transpose(np.argsort(perm))), [], {"perm": perm}
    if op == "Squeeze":
        return "Squeeze", value[None], [np.array([0], np.int64)], {}
    if op == "Unsqueeze" and value.shape[0] == 1:
        return "Unsqueeze", value[0], [np.array([0], np.int64)], {}
    return "Identity", value, [], {}


def chain(name: str, value: np.ndarray, ops: list[str], constant: bool) -> tuple[list, list, str]:
    """Nodes and initializers that compute ``value`` from a stored tensor called ``name`` through
    ``ops`` (in data-flow order; one not applicable to its value becomes an Identity); returns them
    and the tensor the layer reads."""
    nodes, inits, steps = [], [], []
    cast_seen = False
    for op in reversed(ops):  # from the layer back to the stored tensor
        used, value, extra, attrs = _inverse(op, value, cast_seen)
        cast_seen = cast_seen or value.dtype == np.float16
        steps.append((used, extra, attrs))
    source = name
    if constant:
        nodes.append(helper.make_node("Constant", [], [name], name=f"{name}/Constant",
                                      value=numpy_helper.from_array(value, name)))  # fmt: skip
    else:
        inits.append(numpy_helper.from_array(value, name))
    for k, (used, extra, attrs) in enumerate(reversed(steps)):
        names = [f"{name}/c{k}/{j}" for j in range(len(extra))]
        inits += [numpy_helper.from_array(a, n) for a, n in zip(extra, names, strict=True)]
        out = f"{name}/v{k}"
        nodes.append(helper.make_node(used, [source, *names], [out], name=f"{name}/{used}_{k}", **attrs))
        source = out
    return nodes, inits, source


def chained_model(
    layer: str, weight_ops: list[str], bias_ops: list[str], constants: tuple[str, ...] = ()
) -> onnx.ModelProto:
    """input [N, 1, 8, 8] -> Conv(4) + Relu -> the chained ``layer`` (Conv or Gemm) + Relu -> feat;
    ``constants`` names the parameters ("weight", "bias") stored in Constant nodes."""
    rng = np.random.default_rng(0)
    w1, b1 = (rng.normal(size=s).astype(np.float32) * 0.3 for s in ((4, 1, 3, 3), (4,)))
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="/first/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="/first/Relu"),
    ]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1")]
    shape, x = ((4, 4, 3, 3), "r1") if layer == "Conv" else ((8, 256), "flat")
    if layer == "Gemm":
        nodes.append(helper.make_node("Flatten", ["r1"], ["flat"], name="/flatten", axis=1))
    weight = rng.normal(size=shape).astype(np.float32) * 0.1
    bias = rng.normal(size=shape[0]).astype(np.float32) * 0.1
    w_nodes, w_inits, w = chain("weight", weight, weight_ops, "weight" in constants)
    b_nodes, b_inits, b = chain("bias", bias, bias_ops, "bias" in constants)
    attrs = {"pads": [1, 1, 1, 1]} if layer == "Conv" else {"transB": 1}
    nodes += [
        *w_nodes,
        *b_nodes,
        helper.make_node(layer, [x, w, b], ["y"], name=LAYER.format(op=layer), **attrs),
    ]
    nodes.append(helper.make_node("Relu", ["y"], ["feat"], name="/layer/Relu"))
    out_shape = [1, 4, 8, 8] if layer == "Conv" else [1, 8]
    graph = helper.make_graph(
        nodes, "chained", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("feat", TensorProto.FLOAT, out_shape)], [*inits, *w_inits, *b_inits],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def chained_recipe(path: Path, layer: str, **over: object):
    """The digits ONNX-in recipe on ``path``: cut at ``feat``, a 10-class head, training from the
    chained layer (its weight, bias and the head train; the first Conv stays frozen)."""
    from tasks.recipe.load import load_recipe

    values = {"model.onnx": str(path), "model.cut_at": ["feat"], "head.hidden": 0, "quantize": {},
              "trainable.train_from": LAYER.format(op=layer), "training.epochs": 1,
              "training.runtime": "ort-training"}  # fmt: skip
    values.update(over)
    return load_recipe(PROJECT_ROOT / "recipes" / "digits_onnx.toml", values)


def train_steps(artifacts: Path, names: list[str], steps: int = 2, lr: float = 0.05) -> dict[str, float]:
    """Train ``steps`` steps on random digits-shaped batches with ORT's training API (as the board
    does); the largest change of each named parameter."""
    from onnxruntime.training import api

    state = api.CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    before = {n: np.array(state.parameters[n].data) for n in names}
    module = api.Module(str(artifacts / "training_model.onnx"), state, str(artifacts / "eval_model.onnx"))
    optimizer = api.Optimizer(str(artifacts / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(lr)
    module.train()
    rng = np.random.default_rng(0)
    for _ in range(steps):
        module(rng.standard_normal((8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8).astype(np.int64))
        optimizer.step()
        module.lazy_reset_grad()
    return {n: float(np.abs(np.array(state.parameters[n].data) - before[n]).max()) for n in names}
