"""The distillation loss (``loss.kind = "distillation"``): cross-entropy of the student's softened
distribution against the teacher's, as Hinton et al. (2015) define it::

    loss = T^2 * mean_n( -sum_c target[n, c] * log_softmax(logits[n] / T)[c] )

``target`` (the graph input ``labels``, float ``[N, C]``) is the teacher's distribution at the same
temperature, which the board computes from the teacher's outputs (:mod:`device_agent.teacher.labels`);
``T^2`` keeps the gradients' scale independent of T. Built as an onnxblock loss, like the custom
losses of recipes, so ORT generates its gradient graph.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from tasks.prepare.losses.block_ops import block_ops


def distillation_loss(temperature: float, labels: str = "labels") -> Any:
    """An onnxblock Block computing the distillation loss of its scores input against ``labels``."""
    from onnxruntime.training import onnxblock  # imports torch: only when graphs are generated
    from onnxruntime.training.onnxblock import _graph_utils  # onnxblock's own helpers, as its losses use

    class DistillationLoss(onnxblock.Block):
        def build(self, scores: str) -> str:
            graph = self.base.graph
            if not _graph_utils.node_arg_exists(self.base, labels):
                target = copy.deepcopy(_graph_utils.get_output_from_output_name(self.base, scores))
                target.name = labels  # the same [N, C] float as the scores
                graph.input.append(target)
            const, node = block_ops(graph, "distill")

            soft = node("Div", [scores, const(temperature)])
            logp = node("LogSoftmax", [soft], axis=-1)
            per_class = node("Mul", [logp, labels])
            per_sample = node("ReduceSum", [per_class, const([1], np.int64)], keepdims=0)
            mean = node("ReduceMean", [per_sample], keepdims=0)
            return node("Mul", [mean, const(-(temperature**2))])

    return DistillationLoss()


def distillation_numpy(logits: np.ndarray, target: np.ndarray, temperature: float) -> float:
    """The same loss in numpy (the tests' reference)."""
    z = logits.astype(np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-(target * logp).sum(axis=1).mean() * temperature**2)
