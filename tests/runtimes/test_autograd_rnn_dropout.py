"""A multi-layer GRU/LSTM/RNN drops out between its layers in the autograd runtime's train step, as
PyTorch trains it (its layers are :mod:`tasks.prepare.runtimes.autograd.recurrent`'s operators, an
LSTM with ``proj_size`` among them); a layer left to PyTorch's decomposition (one not in float32)
would train without that dropout, and the manifest says so in one warning."""

from __future__ import annotations

import torch

from tasks.prepare.runtimes.autograd.build import rnn_dropout
from tasks.prepare.runtimes.autograd.trace import forward_graph


class Seq(torch.nn.Module):
    def __init__(self, dropout: float, proj_size: int = 0) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 4, num_layers=2, dropout=dropout, batch_first=True, proj_size=proj_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0].sum(dim=1)


def _random(model: torch.nn.Module, training: bool) -> list:
    graph = forward_graph(model, (torch.randn(7, 5, 4),), training, "frozen", 1, ".").graph
    return [n for n in graph.nodes if any(w in str(n.target) for w in ("dropout", "rand", "bernoulli"))]


def test_the_inter_layer_dropout_is_in_the_train_step_only():
    for proj_size in (0, 2):
        assert _random(Seq(0.5, proj_size), training=True)
        assert _random(Seq(0.5, proj_size), training=False) == []
        assert _random(Seq(0.0, proj_size), training=True) == []


def test_a_recurrent_layer_left_without_its_dropout_is_warned_about():
    (line,) = rnn_dropout(Seq(0.5).double())
    assert "1 recurrent layer(s) (rnn)" in line and "trains them without it" in line and "\n" not in line
    assert rnn_dropout(Seq(0.5)) == [] and rnn_dropout(Seq(0.5, proj_size=2)) == []
    assert rnn_dropout(Seq(0.0).double()) == []
