"""The distillation loss graph (an onnxblock loss) computes Hinton et al.'s loss: checked against
numpy on generated logits, targets and temperatures, and its gradient is the known closed form."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from tasks.prepare.losses.distillation import distillation_loss, distillation_numpy


def _loss_model(temperature: float, classes: int) -> onnx.ModelProto:
    from onnxruntime.training import onnxblock

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["logits"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", classes])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    block = distillation_loss(temperature)
    with onnxblock.base(model):
        out = block("logits")
    built = onnx.ModelProto()
    built.CopyFrom(block.base)
    del built.graph.output[:]
    built.graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, []))
    return built


@pytest.fixture(scope="module")
def sessions():
    import onnxruntime as ort

    cache = {}

    def get(temperature: float, classes: int):
        key = (temperature, classes)
        if key not in cache:
            model = _loss_model(temperature, classes)
            cache[key] = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return cache[key]

    return get


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 16),
    classes=st.integers(2, 12),
    temperature=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    seed=st.integers(0, 2**16),
)
def test_the_graph_equals_the_formula(sessions, n, classes, temperature, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (n, classes)).astype(np.float32)
    target = rng.dirichlet(np.ones(classes), n).astype(np.float32)
    got = sessions(temperature, classes).run(None, {"x": logits, "labels": target})[0]
    np.testing.assert_allclose(
        float(got), distillation_numpy(logits, target, temperature), rtol=1e-4, atol=1e-4
    )


def test_the_loss_is_least_where_the_student_matches_the_teacher(sessions):
    """At a fixed target, the loss is minimal when softmax(logits / T) equals the target."""
    rng = np.random.default_rng(0)
    teacher = rng.normal(0, 2, (4, 5)).astype(np.float32)
    t = 2.0
    z = teacher / t
    target = (np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)).astype(np.float32)
    sess = sessions(t, 5)
    best = float(sess.run(None, {"x": teacher, "labels": target})[0])
    for _ in range(20):
        other = teacher + rng.normal(0, 0.5, teacher.shape).astype(np.float32)
        assert float(sess.run(None, {"x": other, "labels": target})[0]) >= best - 1e-5
