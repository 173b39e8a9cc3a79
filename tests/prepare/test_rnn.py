"""Plain recurrent layers (``nn.RNN``): ONNX Runtime 1.19.2 has no gradient for the RNN node, so
one a gradient flows through is unrolled over its steps (tasks/prepare/rewrites/rnn.py); the unrolled graph
computes what the node computed, keeps the parameters' names, and a frozen RNN no gradient reaches
stays as it is."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tasks.prepare.graph import quiet_session
from tasks.prepare.rewrites.rnn import rnns_unrolled
from tests.prepare.seq_kit import export_module, signals


class RNNNet(nn.Module):
    """[N, 3, T] -> nn.RNN (optionally from a learned initial state) -> mean over steps -> Linear."""

    def __init__(self, layers=1, bidirectional=False, nonlinearity="tanh", initial=False):
        super().__init__()
        self.rnn = nn.RNN(
            3, 6, layers, nonlinearity=nonlinearity, batch_first=True, bidirectional=bidirectional
        )
        dirs = 2 if bidirectional else 1
        self.h0 = nn.Parameter(torch.randn(layers * dirs, 1, 6) * 0.1) if initial else None
        self.fc = nn.Linear(6 * dirs, 3)

    def forward(self, x):
        h0 = None if self.h0 is None else self.h0.expand(-1, x.shape[0], -1).contiguous()
        y, h = self.rnn(x.transpose(1, 2), h0)
        return self.fc(y.mean(1)) + h.mean()  # Y and Y_h both used


def _outputs(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return quiet_session(model).run(None, {model.graph.input[0].name: x})


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"nonlinearity": "relu", "bidirectional": True}, {"layers": 2, "initial": True}],
    ids=["tanh", "bidirectional-relu", "stacked-from-a-learned-state"],
)
def test_every_rnn_a_gradient_flows_through_is_unrolled_and_computes_the_same(tmp_path, kwargs):
    torch.manual_seed(0)
    _, model = export_module(RNNNet(**kwargs), tmp_path, signals())
    x = signals(n=4)
    before = _outputs(model, x)
    params = [i.name for i in model.graph.initializer]
    rnns = sum(n.op_type == "RNN" for n in model.graph.node)
    assert rnns_unrolled(model, params) == rnns
    assert "RNN" not in {n.op_type for n in model.graph.node}
    assert set(params) <= {i.name for i in model.graph.initializer}  # the parameters keep their names
    for got, want in zip(_outputs(model, x), before, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_frozen_rnn_no_gradient_reaches_stays_a_node(tmp_path):
    _, model = export_module(RNNNet(), tmp_path, signals())
    assert rnns_unrolled(model, ["fc.weight", "fc.bias"]) == 0
    assert "RNN" in {n.op_type for n in model.graph.node}
