"""Graph fix-ups so ONNX Runtime 1.19.2 can differentiate the models users have.

Each fix-up rewrites a training-mode export in place, keeps what the model computes, and exists
because ``generate_artifacts`` fails without it (read from ORT 1.19.2's gradient builders, checked
on torchvision models by ``bench/zoo.py``):

- ``decompose_hard_activations``: HardSigmoid and HardSwish have no gradient builder
  (MobileNetV3). They become Mul/Add/Clip (and Mul), whose gradients exist.
- ``expose_gradient_outputs``: the LayerNormalization gradient reads the node's optional Mean and
  InvStdDev outputs (ViT, Swin, ConvNeXt), the SoftmaxCrossEntropyLoss gradient its log_prob
  output (a loss inside the model, once its BatchNorms are frozen); the exporter leaves them out.
- ``einsum_as_matmul``: Einsum has no gradient builder; the batched matrix products attention
  writes with it (MaxViT) become MatMul (and Transpose).
- ``drop_identity_pools``: a 1x1, stride-1 pooling after a MaxPool (AlexNet's adaptive pooling at
  224 px) makes ORT's MaxPoolGrad fail at run time; it computes nothing and goes.
- ``split_shared_concats``: the Concat gradient is a Split that defines a gradient for *every*
  input; a tensor needing no gradient that feeds several such Concats (DenseNet's dense blocks)
  then gets the same gradient name twice ("Duplicate definition of name"). Such a Concat becomes
  Pads of its runs of inputs, summed.
- ``average_pools_as_convs`` (:mod:`tasks.prepare.rewrites.pooling`): ORT's AveragePoolGrad sizes its result
  from the static graph shape, so a dynamic batch makes it empty (a frozen BatchNorm or a
  squeeze-excitation gate before ``F.avg_pool2d(x, 4)`` then fails, or the probe dies on SIGFPE);
  each fixed-kernel AveragePool on the gradient path becomes the depthwise Conv it equals.
- ``decompose_operators`` (:mod:`tasks.prepare.rewrites.decompose`): Elu/Selu/Celu, PRelu,
  InstanceNormalization (GroupNorm), DepthToSpace/SpaceToDepth and reflect/edge Pads on the gradient
  path become the operators they are made of, whose gradients ORT has.
- ``resizes_as_matmuls`` (:mod:`tasks.prepare.rewrites.resize`): ORT has no CPU kernel for ResizeGrad; a 2-D
  upsampling on the gradient path becomes the two MatMuls it equals; likewise ConvTransposeGrad, so a
  ConvTranspose becomes the Conv of its zero-inserted input (:mod:`tasks.prepare.rewrites.conv_transpose`),
  and a bidirectional LSTM two forward ones (:mod:`tasks.prepare.rewrites.lstm`; ORT trains forward only).
- ``rnns_unrolled`` (:mod:`tasks.prepare.rewrites.rnn`): ORT has no gradient for RNN (``nn.RNN``); one a
  gradient flows through becomes its steps' MatMuls, Adds and activations.
- ``freeze_batchnorm``: on-device training normalises with batch statistics while the exported
  inference model uses running ones; every BatchNormalization becomes the affine Mul/Add of its
  running statistics, so training and inference compute the same function (its scale and bias
  stay trainable parameters of the same names when the trainable set holds them).

The BatchNorm rewrite lives in :mod:`tasks.prepare.rewrites.batchnorm`, the graph helpers in
:mod:`tasks.prepare.graph`, the one-line messages for what cannot be fixed in
:mod:`tasks.prepare.messages`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from tasks.prepare.graph import add_const, attr, bypass, downstream, rebuild, shapes_of
from tasks.prepare.rewrites.batchnorm import freeze_batchnorm
from tasks.prepare.rewrites.conv_transpose import conv_transposes_as_convs
from tasks.prepare.rewrites.decompose import decompose_operators
from tasks.prepare.rewrites.lstm import bidirectional_lstms_as_forward
from tasks.prepare.rewrites.pooling import average_pools_as_convs
from tasks.prepare.rewrites.resize import resizes_as_matmuls
from tasks.prepare.rewrites.rnn import rnns_unrolled


@dataclass
class FixupReport:
    """What the fix-ups changed (counts per fix-up), for the manifest and the log."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, n: int) -> None:
        if n:
            self.counts[name] = self.counts.get(name, 0) + n


def decompose_hard_activations(model: onnx.ModelProto) -> int:
    """HardSigmoid(x) -> Clip(alpha*x + beta, 0, 1); HardSwish(x) -> x * HardSigmoid_{1/6, 1/2}(x)."""
    replace = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type not in ("HardSigmoid", "HardSwish"):
            continue
        alpha, beta = (
            (1 / 6, 0.5)
            if node.op_type == "HardSwish"
            else (attr(node, "alpha", 0.2), attr(node, "beta", 0.5))
        )
        p, x = f"{node.name or node.output[0]}/decomposed", node.input[0]
        c = {k: add_const(model, f"{p}/{k}", np.array(v, np.float32)) for k, v in
             (("alpha", alpha), ("beta", beta), ("zero", 0.0), ("one", 1.0))}  # fmt: skip
        hs = node.output[0] if node.op_type == "HardSigmoid" else f"{p}/hardsigmoid"
        replace[i] = [
            helper.make_node("Mul", [x, c["alpha"]], [f"{p}/scaled"], name=f"{p}/Mul"),
            helper.make_node("Add", [f"{p}/scaled", c["beta"]], [f"{p}/shifted"], name=f"{p}/Add"),
            helper.make_node("Clip", [f"{p}/shifted", c["zero"], c["one"]], [hs], name=f"{p}/Clip"),
        ]
        if node.op_type == "HardSwish":
            replace[i].append(helper.make_node("Mul", [x, hs], [node.output[0]], name=f"{p}/Mul_x"))
    rebuild(model, replace)
    return len(replace)


# optional outputs a gradient builder of ORT 1.19.2 reads, which the exporter leaves out
GRADIENT_OUTPUTS = {"LayerNormalization": ("mean", "inv_std_dev"), "SoftmaxCrossEntropyLoss": ("log_prob",)}


def expose_gradient_outputs(model: onnx.ModelProto) -> int:
    """Give LayerNormalization its Mean/InvStdDev and SoftmaxCrossEntropyLoss its log_prob outputs."""
    count = 0
    for node in model.graph.node:
        extra = GRADIENT_OUTPUTS.get(node.op_type, ())
        if len(node.output) < 1 + len(extra):
            base = node.name or node.output[0]
            node.output.extend(f"{base}/{name}" for name in extra[len(node.output) - 1 :])
            count += 1
    return count


def drop_identity_pools(model: onnx.ModelProto) -> int:
    """Remove AveragePool/MaxPool nodes with a 1x1 window, stride 1 and no padding (the identity
    an adaptive pooling exports as when its input already has the output size, AlexNet at 224 px);
    ORT 1.19.2's gradient of a MaxPool feeding one of them fails at run time on mismatched shapes."""

    def identity_pool(node: onnx.NodeProto) -> bool:
        return (
            node.op_type in ("AveragePool", "MaxPool")
            and all(v == 1 for v in attr(node, "kernel_shape", [0]))
            and all(v == 1 for v in attr(node, "strides", [1]))
            and not any(attr(node, "pads", [0]))
        )

    return bypass(model, identity_pool)


def einsum_as_matmul(model: onnx.ModelProto) -> int:
    """Rewrite two-operand Einsums that are batched matrix products as MatMul (ORT 1.19.2 has no
    Einsum gradient; MaxViT's attention writes ``bghid,bghjd->bghij`` and ``bghij,bghjd->bghid``).

    ``...ik,...jk->...ij`` becomes ``MatMul(a, Transpose(b))`` and ``...ij,...jk->...ik``
    ``MatMul(a, b)``, for the same batch letters in the same order; other equations are left.
    """
    replace = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type != "Einsum" or len(node.input) != 2:
            continue
        raw = attr(node, "equation", b"")
        eq = (raw.decode() if isinstance(raw, bytes) else str(raw)).replace(" ", "")
        lhs, _, out = eq.partition("->")
        a, _, b = lhs.partition(",")
        if not (len(a) == len(b) == len(out) >= 2 and a[:-2] == b[:-2] == out[:-2]):
            continue
        (ai, ak), (bj, bk), (oi, oj) = a[-2:], b[-2:], out[-2:]
        p = node.name or node.output[0]
        if ak == bk and (ai, bj) == (oi, oj) and len({ai, ak, bj}) == 3:  # a @ b^T
            perm = [*range(len(b) - 2), len(b) - 1, len(b) - 2]
            replace[i] = [
                helper.make_node("Transpose", [node.input[1]], [f"{p}/bT"], perm=perm, name=f"{p}/Transpose"),
                helper.make_node("MatMul", [node.input[0], f"{p}/bT"], [node.output[0]], name=f"{p}/MatMul"),
            ]
        elif ak == bj and (ai, bk) == (oi, oj) and len({ai, ak, bk}) == 3:  # a @ b
            replace[i] = [helper.make_node("MatMul", list(node.input), [node.output[0]], name=f"{p}/MatMul")]
    rebuild(model, replace)
    return len(replace)


def _runs(inputs: list[str], needs: set[str]) -> list[tuple[bool, list[str]]]:
    runs: list[tuple[bool, list[str]]] = []
    for name in inputs:
        if runs and runs[-1][0] == (name in needs):
            runs[-1][1].append(name)
        else:
            runs.append((name in needs, [name]))
    return runs


def split_shared_concats(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite Concats on the gradient path whose gradient-free inputs feed other Concats too.

    ``Concat(a, b, c)`` along axis k becomes ``Pad(a) + Pad(Concat(b, c))`` where each run of inputs
    is padded with zeros to its place in the result: the same values, and only the Add gradient,
    which skips inputs that need none, reaches the shared tensor.
    """
    needs = downstream(model, set(trainable))
    on_path = [n for n in model.graph.node if n.op_type == "Concat" and n.output[0] in needs]
    shared = Counter(i for n in on_path for i in n.input if i not in needs)
    todo = {i for i, n in enumerate(model.graph.node) if n in on_path and any(shared[x] > 1 for x in n.input)}
    if not todo:
        return 0
    shapes = shapes_of(model)
    replace = {i: _concat_as_pads(model, model.graph.node[i], shapes, needs) for i in todo}
    replace = {i: nodes for i, nodes in replace.items() if nodes}  # sizes unknown: left as they are
    rebuild(model, replace)
    return len(replace)


def _concat_as_pads(
    model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]], needs: set[str]
) -> list[onnx.NodeProto]:
    """The Pad/Add nodes replacing ``node``, or ``[]`` when its inputs' sizes are not static."""
    rank = len(shapes.get(node.input[0], []))
    if not rank or any(len(shapes.get(i, [])) != rank for i in node.input):
        return []
    axis = int(attr(node, "axis", 0)) % rank
    sizes = [shapes[i][axis] for i in node.input]
    if min(sizes) < 0:
        return []
    total, offset, out, parts = sum(sizes), 0, node.output[0], []
    nodes = []
    for k, (_, names) in enumerate(_runs(list(node.input), needs)):
        size = sum(shapes[n][axis] for n in names)
        x = names[0]
        if len(names) > 1:
            x = f"{out}/run{k}"
            nodes.append(helper.make_node("Concat", names, [x], axis=axis, name=f"{node.name}/run{k}"))
        pads = np.zeros(2 * rank, np.int64)
        pads[axis], pads[rank + axis] = offset, total - offset - size
        parts.append(f"{out}/padded{k}")
        nodes.append(
            helper.make_node(
                "Pad", [x, add_const(model, f"{out}/pads{k}", pads)], [parts[-1]], name=f"{node.name}/pad{k}"
            )
        )
        offset += size
    acc = parts[0]
    for k, part in enumerate(parts[1:], start=1):
        target = out if k == len(parts) - 1 else f"{out}/sum{k}"
        nodes.append(helper.make_node("Add", [acc, part], [target], name=f"{node.name}/sum{k}"))
        acc = target
    return nodes


def apply_all(model: onnx.ModelProto, trainable: list[str], *, batchnorm: str = "frozen") -> FixupReport:
    """Run every fix-up the model needs for ``trainable``; ``batchnorm`` is the recipe's option."""
    report = FixupReport()
    report.add("hard_activations_decomposed", decompose_hard_activations(model))
    report.add("gradient_outputs_exposed", expose_gradient_outputs(model))
    report.add("identity_pools_dropped", drop_identity_pools(model))
    report.add("einsums_as_matmul", einsum_as_matmul(model))
    report.add("average_pools_as_convs", average_pools_as_convs(model, trainable))
    report.add("operators_decomposed", decompose_operators(model, trainable))
    report.add("resizes_as_matmuls", resizes_as_matmuls(model, trainable))
    report.add("conv_transposes_as_convs", conv_transposes_as_convs(model, trainable))
    report.add("bidirectional_lstms_split", bidirectional_lstms_as_forward(model, trainable))
    report.add("rnns_unrolled", rnns_unrolled(model, trainable))
    if batchnorm == "frozen":
        report.add("batchnorm_frozen", freeze_batchnorm(model, trainable))
    report.add("shared_concats_split", split_shared_concats(model, trainable))
    return report
