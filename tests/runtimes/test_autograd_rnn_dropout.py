"""PyTorch's export of a multi-layer GRU/LSTM leaves its inter-layer dropout out (its RNN
decomposition never applies it); the autograd runtime says so in one manifest warning."""

from __future__ import annotations

import torch

from tasks.prepare.runtimes.autograd.build import rnn_dropout
from tasks.prepare.runtimes.autograd.trace import forward_graph


class Seq(torch.nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(4, 4, num_layers=2, dropout=dropout, batch_first=True)
        self.lstm = torch.nn.LSTM(4, 4, num_layers=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x)[0].sum(dim=1)


def test_torch_s_export_leaves_the_inter_layer_dropout_out():
    graph = forward_graph(Seq(0.5), (torch.randn(7, 5, 4),), True, "frozen", 1, ".").graph
    random = [n for n in graph.nodes if any(w in str(n.target) for w in ("dropout", "rand", "bernoulli"))]
    assert random == []  # when this fails, PyTorch applies it: the warning below can go


def test_a_recurrent_layer_with_dropout_is_warned_about():
    (line,) = rnn_dropout(Seq(0.5))
    assert "1 recurrent layer(s) (gru)" in line and "trains them without it" in line and "\n" not in line
    assert rnn_dropout(Seq(0.0)) == []
