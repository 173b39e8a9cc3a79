"""The autograd runtime's numpy optimizers are ONNX Runtime's: each step, fed the gradients ORT's
training Module computed, moves every weight where ORT's own optimizer graph moves it; and its
checkpoint keeps tensors, optimizer state and properties exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper

from device_agent.runtimes.state import CheckpointState, Optimizer

FEATURES, CLASSES, BATCH, STEPS = 6, 4, 8, 25
ADAMW = {"betas": [0.9, 0.999], "eps": 1e-6}  # onnxblock.optim.AdamW's defaults


def _linear_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((CLASSES, FEATURES)).astype(np.float32), "fc.weight")
    b = numpy_helper.from_array(rng.standard_normal(CLASSES).astype(np.float32), "fc.bias")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "fc.weight", "fc.bias"], ["logits"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ort_run(tmp_path, kind: str, weight_decay: float, lr: float):
    """ORT's Module + Optimizer over STEPS random batches: each step's gradients and weights after it."""
    from onnxruntime.training import api, artifacts, onnxblock

    optim = onnxblock.optim.AdamW(weight_decay=weight_decay) if kind == "adamw" else artifacts.OptimType.SGD
    artifacts.generate_artifacts(_linear_model(), requires_grad=["fc.weight", "fc.bias"], frozen_params=[],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=optim,
                                 artifact_directory=tmp_path)  # fmt: skip
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    optimizer = api.Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(lr)
    rng = np.random.default_rng(1)
    start = {n: np.array(p.data) for n, p in state.parameters}
    grads, weights = [], []
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
        module(x, rng.integers(0, CLASSES, BATCH).astype(np.int64))
        grads.append({n: np.array(p.grad) for n, p in state.parameters})
        optimizer.step()
        module.lazy_reset_grad()
        weights.append({n: np.array(p.data) for n, p in state.parameters})
    return start, grads, weights


class _Gradients:
    """What the optimizer reads of a module: its state and the last step's gradients."""

    def __init__(self, state: CheckpointState) -> None:
        self.state, self.grads = state, {}

    def gradients(self) -> dict[str, np.ndarray]:
        return self.grads


@pytest.mark.ort_training
@pytest.mark.parametrize(
    ("kind", "weight_decay", "lr"),
    [("adamw", 0.01, 1e-2), ("adamw", 0.0, 3e-3), ("adamw", 0.3, 0.05), ("sgd", 0.0, 0.1)],
)
def test_each_step_moves_the_weights_as_onnxruntime_s_optimizer(tmp_path, kind, weight_decay, lr):
    start, grads, want = _ort_run(tmp_path, kind, weight_decay, lr)
    spec = {"kind": kind, "lr": lr, **(ADAMW | {"weight_decay": weight_decay} if kind == "adamw" else {})}
    module = _Gradients(CheckpointState(start))
    optimizer = Optimizer(spec, module)
    for step in range(STEPS):
        module.grads = grads[step]
        optimizer.step()
        for name, w in want[step].items():
            got = module.state.parameters[name].data
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=f"{name} at step {step + 1}")
    assert module.state.optimizer["step"] == STEPS


def test_set_learning_rate_takes_effect_at_the_next_step():
    state = CheckpointState({"w": np.ones(3, np.float32)})
    module = _Gradients(state)
    module.grads = {"w": np.full(3, 2.0, np.float32)}
    optimizer = Optimizer({"kind": "sgd", "lr": 0.1}, module)
    optimizer.step()
    optimizer.set_learning_rate(0.25)
    optimizer.step()
    np.testing.assert_allclose(state.parameters["w"].data, 1 - 0.1 * 2 - 0.25 * 2, rtol=1e-6)


tensors = st.dictionaries(
    st.text("abcdefgh._", min_size=1, max_size=12),
    hnp.arrays(np.float32, hnp.array_shapes(max_dims=3, max_side=4), elements=st.floats(-1e6, 1e6, width=32)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None)
@given(
    tensors=tensors,
    step=st.integers(0, 10**6),
    props=st.dictionaries(st.text(max_size=8), st.integers() | st.text()),
)
def test_a_checkpoint_gives_back_what_was_saved(tmp_path_factory, tensors, step, props):
    path = tmp_path_factory.mktemp("ckpt") / "ckpt-00000001"
    state = CheckpointState(tensors)
    state.optimizer = {
        "step": step,
        "m": {n: t * 2 for n, t in tensors.items()},
        "v": {n: t * t for n, t in tensors.items()},
    }
    state.properties.update(props)
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    back = CheckpointState.load_checkpoint(path)
    assert [n for n, _ in back.parameters] == list(tensors)
    for name, tensor in tensors.items():
        assert np.array_equal(back.parameters[name].data, tensor)
        assert np.array_equal(back.optimizer["m"][name], tensor * 2)
        assert np.array_equal(back.optimizer["v"][name], tensor * tensor)
    assert back.optimizer["step"] == step and back.properties == props
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


@pytest.mark.parametrize(("momentum", "nesterov"), [(0.9, False), (0.5, True), (0.0, False)])
def test_sgd_with_momentum_steps_as_torch_optim_sgd(momentum, nesterov):
    """Each step, from the same gradients and with the rate changed as a schedule changes it, moves
    the weights where torch.optim.SGD (dampening 0) moves them; the buffer is the optimizer's ``m``."""
    import torch  # the reference optimizer; the agent's code under test never imports it

    rng = np.random.default_rng(3)
    start = {
        "w": rng.standard_normal((CLASSES, FEATURES)).astype(np.float32),
        "b": np.zeros(CLASSES, np.float32),
    }
    params = {n: torch.tensor(a, requires_grad=True) for n, a in start.items()}
    reference = torch.optim.SGD(list(params.values()), lr=0.1, momentum=momentum, nesterov=nesterov)
    module = _Gradients(CheckpointState(start))
    optimizer = Optimizer({"kind": "sgd", "lr": 0.1, "momentum": momentum, "nesterov": nesterov}, module)
    for step in range(STEPS):
        lr = 0.1 * (1 - step / STEPS)  # a decaying schedule, set before each step as the trainer does
        optimizer.set_learning_rate(lr)
        for group in reference.param_groups:
            group["lr"] = float(np.float32(lr))
        module.grads = {n: rng.standard_normal(a.shape).astype(np.float32) for n, a in start.items()}
        for name, p in params.items():
            p.grad = torch.from_numpy(module.grads[name].copy())
        reference.step()
        optimizer.step()
        for name, p in params.items():
            got = module.state.parameters[name].data
            assert got.dtype == np.float32
            np.testing.assert_allclose(
                got, p.detach().numpy(), rtol=1e-6, atol=1e-7, err_msg=f"{name} at {step + 1}"
            )
            if momentum:
                buf = reference.state[p]["momentum_buffer"].numpy()
                np.testing.assert_allclose(module.state.optimizer["m"][name], buf, rtol=1e-6, atol=1e-7)
    assert (module.state.optimizer["m"] == {}) == (momentum == 0)
