"""Recurrent layers under the autograd runtime: one operator per layer and direction
(:mod:`tasks.prepare.runtimes.autograd.recurrent`), written as ONNX's RNN/GRU/LSTM forward and a
``Scan`` backward (:mod:`tasks.prepare.runtimes.autograd.recurrent_onnx`). Generated models (cell,
sizes, layers, directions, batch-first, bias, initial states, read-out) give PyTorch's loss and
gradients at a batch the trace never saw; the step's size does not grow with the sequence length;
a wrong backward is refused before any file is written."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tasks.errors import ArtifactError
from tasks.prepare.runtimes.autograd import recurrent, recurrent_math
from tasks.prepare.runtimes.autograd.onnx_step import StepGraph, export_step
from tasks.prepare.runtimes.autograd.op_checks import check_recorded, recording
from tasks.prepare.runtimes.autograd.steps import example_batch
from tasks.prepare.runtimes.autograd.trace import StepInputs, forward_graph, trace_step

CELLS = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM, "tanh": torch.nn.RNN, "relu": torch.nn.RNN}


class Net(torch.nn.Module):
    """A linear layer per step, a recurrent layer, a read-out and a linear head."""

    def __init__(self, cell: str, features: int, hidden: int, layers: int, bidirectional: bool,
                 batch_first: bool, bias: bool, initial: bool, readout: str, proj: int = 0) -> None:  # fmt: skip
        super().__init__()
        extra = {"nonlinearity": cell} if cell in ("tanh", "relu") else {"proj_size": proj} if proj else {}
        out = proj or hidden  # an LSTM's projected states
        self.pre, self.init_h, self.init_c = (torch.nn.Linear(3, n) for n in (features, out, hidden))
        self.rnn = CELLS[cell](features, hidden, layers, bias=bias, batch_first=batch_first,
                               bidirectional=bidirectional, **extra)  # fmt: skip
        width = hidden if readout == "state" and cell == "lstm" else out  # the state read: an LSTM's cell
        self.head = torch.nn.Linear(width * (2 if bidirectional else 1), 4)
        self.initial, self.readout, self.cell = initial, readout, cell

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [N, T, 3]
        z = self.pre(x)
        z = z if self.rnn.batch_first else z.transpose(0, 1)
        hx = None
        if self.initial:  # states computed from the input, so their gradients flow
            dirs = self.rnn.num_layers * (2 if self.rnn.bidirectional else 1)
            h, c = (torch.tanh(f(x.mean(1))).unsqueeze(0).expand(dirs, -1, -1).contiguous()
                    for f in (self.init_h, self.init_c))  # fmt: skip
            hx = (h, c) if self.cell == "lstm" else h
        out, state = self.rnn(z, hx)
        if self.readout == "state":
            last = (state[1] if self.cell == "lstm" else state)[-1]
            return self.head(torch.cat([last] * (2 if self.rnn.bidirectional else 1), -1))
        out = out if self.rnn.batch_first else out.transpose(0, 1)
        return self.head(out.mean(1) if self.readout == "mean" else out[:, -1])


def _cross_entropy(outputs: tuple, labels: tuple) -> tuple:
    return torch.nn.functional.cross_entropy(outputs[0], labels[0]), (outputs[0],)


def _export(model: torch.nn.Module, steps: int, path):
    """The model's train step (every tensor trainable) traced at a batch no other size equals (as
    the preparation chooses it) and exported to ``path``."""
    batch = example_batch(model, [(steps, 3)])
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, steps, 3, generator=gen), torch.randint(0, 4, (batch,), generator=gen)
    forward = forward_graph(model, (x,), True, "frozen", 1, ".")
    trainable = {n: p.detach() for n, p in forward.named_parameters()}
    frozen = {n: b.detach() for n, b in forward.named_buffers()}
    step = StepInputs([("x", x), ("labels", y)], 1, trainable, frozen, _cross_entropy)
    with recording() as uses:
        gm = trace_step(forward, step, grads=True)
    checked = check_recorded(uses)
    outputs = ["loss", "logits", *[f"{n}_grad" for n in trainable]]
    graph = StepGraph(gm, [("x", x), ("labels", y), *trainable.items()], {"x", "labels"}, list(frozen.values()), [],
                      outputs)  # fmt: skip
    checked.update(export_step(graph, path))
    return trainable, checked


def _nodes(graph: onnx.GraphProto) -> int:
    return sum(
        1 + sum(_nodes(a.g) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH) for n in graph.node
    )


# 4 generated models beside the 5 kept below, which cover each cell (a model costs 2-4 s of torch.export)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cell=st.sampled_from(sorted(CELLS)),
    features=st.integers(1, 5),
    hidden=st.integers(1, 6),
    layers=st.integers(1, 2),
    bidirectional=st.booleans(),
    batch_first=st.booleans(),
    bias=st.booleans(),
    initial=st.booleans(),
    readout=st.sampled_from(["last", "mean", "state"]),
    steps=st.integers(1, 9),
    proj=st.integers(0, 3),
)
@example(cell="lstm", features=3, hidden=4, layers=2, bidirectional=True, batch_first=True, bias=True,
         initial=True, readout="state", steps=5, proj=0)  # fmt: skip
# projected states
@example(cell="lstm", features=2, hidden=5, layers=2, bidirectional=True, batch_first=False, bias=True,
         initial=True, readout="last", steps=4, proj=3)  # fmt: skip
@example(cell="gru", features=1, hidden=1, layers=1, bidirectional=False, batch_first=False, bias=False,
         initial=False, readout="last", steps=1, proj=0)  # fmt: skip
# as long as the trace's batch
@example(cell="gru", features=1, hidden=1, layers=1, bidirectional=False, batch_first=False, bias=False,
         initial=False, readout="last", steps=7, proj=0)  # fmt: skip
# a plain RNN (relu) with initial states, two layers each way, batch first
@example(cell="relu", features=2, hidden=3, layers=2, bidirectional=True, batch_first=True, bias=True,
         initial=True, readout="mean", steps=3, proj=0)  # fmt: skip
def test_generated_recurrent_models_train_with_pytorch_s_gradients(
    tmp_path_factory,
    cell,
    features,
    hidden,
    layers,
    bidirectional,
    batch_first,
    bias,
    initial,
    readout,
    steps,
    proj,
):
    torch.manual_seed(0)
    proj = proj if cell == "lstm" and proj < hidden else 0  # an LSTM's proj_size, below its hidden size
    model = Net(cell, features, hidden, layers, bidirectional, batch_first, bias, initial, readout, proj)
    path = tmp_path_factory.mktemp("step") / "train_step.onnx"
    trainable, checked = _export(model, steps, path)
    assert any("odl_rnn.layer_backward" in k for k in checked)  # checked against PyTorch's autograd
    step = onnx.load(str(path))
    assert {n.op_type for n in step.graph.node} & {
        "GRU",
        "LSTM",
        "RNN",
        "Scan",
    }  # ONNX's own forward, or a Scan (projected)
    assert not [o for o in step.opset_import if o.domain not in ("", "ai.onnx")]  # no placeholder left
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(3, steps, 3, generator=gen), torch.randint(0, 4, (3,), generator=gen)  # another batch
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(
        None, {"x": x.numpy(), "labels": y.numpy(), **{n: t.numpy() for n, t in trainable.items()}}
    )
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert abs(got[0] - loss.item()) <= 1e-5 * max(1.0, abs(loss.item()))
    for (name, _), grad in zip(trainable.items(), got[2:], strict=True):
        param = dict(model.named_parameters())[name]
        want = np.zeros_like(grad) if param.grad is None else param.grad.numpy()  # unused: no gradient
        assert np.abs(grad - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), name


@pytest.mark.parametrize("cell", ["gru", "lstm", "tanh"])
def test_the_step_does_not_grow_with_the_sequence_length(tmp_path, cell):
    sizes = []
    for steps in (8, 64):
        torch.manual_seed(0)
        model = Net(cell, 4, 8, 1, True, True, True, False, "mean")
        _export(model, steps, tmp_path / f"step{steps}.onnx")
        sizes.append(_nodes(onnx.load(str(tmp_path / f"step{steps}.onnx")).graph))
    assert sizes[0] == sizes[1]


def test_a_wrong_backward_is_refused_in_one_line(tmp_path, monkeypatch):
    right = recurrent_math.backward_math

    def wrong(*args):
        grads = right(*args)
        return [grads[0], grads[1], grads[2], grads[3] * 1.01, *grads[4:]]  # the input weights' 1 % off

    monkeypatch.setattr(recurrent_math, "backward_math", wrong)
    with pytest.raises(ArtifactError) as caught:
        _export(Net("gru", 3, 4, 1, False, True, True, False, "last"), 6, tmp_path / "step.onnx")
    message = str(caught.value)
    assert "odl_rnn.layer_backward" in message and "PyTorch's autograd" in message and "\n" not in message
    assert not (tmp_path / "step.onnx").exists()


def test_modules_it_does_not_cover_keep_pytorch_s_decomposition():
    assert recurrent.covered(torch.nn.GRU(3, 4))
    assert recurrent.covered(torch.nn.LSTM(3, 4, proj_size=2))
    assert not recurrent.covered(torch.nn.GRU(3, 4).double())
    assert not recurrent.covered(torch.nn.Linear(3, 4))
