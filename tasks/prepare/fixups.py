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
- ``freeze_batchnorm``: on-device training normalises with batch statistics while the exported
  inference model uses running ones; every BatchNormalization becomes the affine Mul/Add of its
  running statistics, so training and inference compute the same function (its scale and bias
  stay trainable parameters of the same names when the trainable set holds them).

``no_gradient_message`` turns ORT's "gradient builder has not been registered" into one line.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper


@dataclass
class FixupReport:
    """What the fix-ups changed (counts per fix-up), for the manifest and the log."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, n: int) -> None:
        if n:
            self.counts[name] = self.counts.get(name, 0) + n


def _attr(node: onnx.NodeProto, name: str, default: float | int) -> float | int:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _const(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def _rebuild(model: onnx.ModelProto, replace: dict[int, list[onnx.NodeProto]]) -> None:
    """Replace nodes by index with node lists, keeping the topological order."""
    nodes = [n for i, old in enumerate(model.graph.node) for n in replace.get(i, [old])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def decompose_hard_activations(model: onnx.ModelProto) -> int:
    """HardSigmoid(x) -> Clip(alpha*x + beta, 0, 1); HardSwish(x) -> x * HardSigmoid_{1/6, 1/2}(x)."""
    replace = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type not in ("HardSigmoid", "HardSwish"):
            continue
        alpha, beta = (
            (1 / 6, 0.5)
            if node.op_type == "HardSwish"
            else (_attr(node, "alpha", 0.2), _attr(node, "beta", 0.5))
        )
        p, x = f"{node.name or node.output[0]}/decomposed", node.input[0]
        c = {k: _const(model, f"{p}/{k}", np.array(v, np.float32)) for k, v in
             (("alpha", alpha), ("beta", beta), ("zero", 0.0), ("one", 1.0))}  # fmt: skip
        hs = node.output[0] if node.op_type == "HardSigmoid" else f"{p}/hardsigmoid"
        replace[i] = [
            helper.make_node("Mul", [x, c["alpha"]], [f"{p}/scaled"], name=f"{p}/Mul"),
            helper.make_node("Add", [f"{p}/scaled", c["beta"]], [f"{p}/shifted"], name=f"{p}/Add"),
            helper.make_node("Clip", [f"{p}/shifted", c["zero"], c["one"]], [hs], name=f"{p}/Clip"),
        ]
        if node.op_type == "HardSwish":
            replace[i].append(helper.make_node("Mul", [x, hs], [node.output[0]], name=f"{p}/Mul_x"))
    _rebuild(model, replace)
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
    rename: dict[str, str] = {}
    kept = []
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        node.input[:] = [rename.get(i, i) for i in node.input]
        ones = all(v == 1 for v in _attr(node, "kernel_shape", [0])) and all(
            v == 1 for v in _attr(node, "strides", [1])
        )
        if (
            node.op_type in ("AveragePool", "MaxPool")
            and len(node.output) == 1
            and ones
            and not any(_attr(node, "pads", [0]))
            and node.output[0] not in outputs
        ):
            rename[node.output[0]] = node.input[0]
            continue
        kept.append(node)
    if rename:
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return len(rename)


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
        raw = _attr(node, "equation", b"")
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
    _rebuild(model, replace)
    return len(replace)


def downstream(model: onnx.ModelProto, sources: set[str]) -> set[str]:
    """Tensors computed from any of ``sources`` (ONNX graphs are topologically sorted)."""
    reached = set(sources)
    for node in model.graph.node:
        if any(i in reached for i in node.input):
            reached.update(o for o in node.output if o)
    return reached


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    values = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    out = {
        v.name: [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
        for v in values
    }
    out.update({i.name: list(i.dims) for i in model.graph.initializer})
    return out


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
    shapes = _shapes(model)
    replace = {i: _concat_as_pads(model, model.graph.node[i], shapes, needs) for i in todo}
    replace = {i: nodes for i, nodes in replace.items() if nodes}  # sizes unknown: left as they are
    _rebuild(model, replace)
    return len(replace)


def _concat_as_pads(
    model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]], needs: set[str]
) -> list[onnx.NodeProto]:
    """The Pad/Add nodes replacing ``node``, or ``[]`` when its inputs' sizes are not static."""
    rank = len(shapes.get(node.input[0], []))
    if not rank or any(len(shapes.get(i, [])) != rank for i in node.input):
        return []
    axis = int(_attr(node, "axis", 0)) % rank
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
                "Pad", [x, _const(model, f"{out}/pads{k}", pads)], [parts[-1]], name=f"{node.name}/pad{k}"
            )
        )
        offset += size
    acc = parts[0]
    for k, part in enumerate(parts[1:], start=1):
        target = out if k == len(parts) - 1 else f"{out}/sum{k}"
        nodes.append(helper.make_node("Add", [acc, part], [target], name=f"{node.name}/sum{k}"))
        acc = target
    return nodes


def freeze_batchnorm(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite every BatchNormalization as ``x * s + t`` from its running statistics.

    ``s = scale / sqrt(var + eps)`` and ``t = bias - mean * s`` become frozen constants. When the
    trainable set holds the node's scale or bias, they stay parameters of the same names:
    ``(x * inv_std + (-mean * inv_std)) * scale + bias`` with both reshaped to broadcast.
    """
    inits = {i.name: i for i in model.graph.initializer}
    shapes = None
    replace = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type != "BatchNormalization" or not all(n in inits for n in node.input[1:5]):
            continue
        shapes = shapes or _shapes(model)
        rank = len(shapes.get(node.input[0], []))
        if rank < 2:  # rank unknown: broadcasting the statistics would be a guess, keep the node
            continue
        scale, bias, mean, var = (numpy_helper.to_array(inits[n]).astype(np.float64) for n in node.input[1:5])
        inv = 1.0 / np.sqrt(var + float(_attr(node, "epsilon", 1e-5)))
        bshape = (-1, *([1] * (rank - 2)))
        p, x = node.name or node.output[0], node.input[0]
        if not {node.input[1], node.input[2]} & set(trainable):
            s = _const(model, f"{p}/frozen_scale", (scale * inv).astype(np.float32).reshape(bshape))
            t = _const(
                model, f"{p}/frozen_shift", (bias - mean * scale * inv).astype(np.float32).reshape(bshape)
            )
            replace[i] = [
                helper.make_node("Mul", [x, s], [f"{p}/scaled"], name=f"{p}/Mul"),
                helper.make_node("Add", [f"{p}/scaled", t], [node.output[0]], name=f"{p}/Add"),
            ]
            continue
        s = _const(model, f"{p}/frozen_inv_std", inv.astype(np.float32).reshape(bshape))
        t = _const(model, f"{p}/frozen_neg_mean_inv_std", (-mean * inv).astype(np.float32).reshape(bshape))
        shape = _const(model, f"{p}/affine_shape", np.array(bshape, np.int64))
        replace[i] = [
            helper.make_node("Mul", [x, s], [f"{p}/normed0"], name=f"{p}/Mul_norm"),
            helper.make_node("Add", [f"{p}/normed0", t], [f"{p}/normed"], name=f"{p}/Add_norm"),
            helper.make_node("Reshape", [node.input[1], shape], [f"{p}/scale"], name=f"{p}/Reshape_scale"),
            helper.make_node("Reshape", [node.input[2], shape], [f"{p}/bias"], name=f"{p}/Reshape_bias"),
            helper.make_node("Mul", [f"{p}/normed", f"{p}/scale"], [f"{p}/scaled"], name=f"{p}/Mul"),
            helper.make_node("Add", [f"{p}/scaled", f"{p}/bias"], [node.output[0]], name=f"{p}/Add"),
        ]
    _rebuild(model, replace)
    drop_unused_initializers(model)
    return len(replace)


def drop_unused_initializers(model: onnx.ModelProto) -> int:
    """Remove initializers no node reads (a rewritten BatchNorm's statistics, say)."""
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [i for i in model.graph.initializer if i.name in used]
    dropped = len(model.graph.initializer) - len(keep)
    if dropped:
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
    return dropped


def apply_all(model: onnx.ModelProto, trainable: list[str], *, batchnorm: str = "frozen") -> FixupReport:
    """Run every fix-up the model needs for ``trainable``; ``batchnorm`` is the recipe's option."""
    report = FixupReport()
    report.add("hard_activations_decomposed", decompose_hard_activations(model))
    report.add("gradient_outputs_exposed", expose_gradient_outputs(model))
    report.add("identity_pools_dropped", drop_identity_pools(model))
    report.add("einsums_as_matmul", einsum_as_matmul(model))
    if batchnorm == "frozen":
        report.add("batchnorm_frozen", freeze_batchnorm(model, trainable))
    report.add("shared_concats_split", split_shared_concats(model, trainable))
    return report


_NO_GRADIENT = re.compile(r"gradient builder has not been registered:\s*(\w+)(?: for node\s*(\S*))?")


def layer_of(node_name: str) -> str:
    """The PyTorch module path of an exporter node name.

    ``/features/features.1/block/block.1/fc2/Conv`` -> ``features.1.block.1.fc2``: each scope is a
    child's name, and a Sequential's children are spelled ``<parent>.<index>``.
    """
    scopes = [p for p in node_name.split("/") if p][:-1]
    if not scopes:
        return node_name
    path, prev = [], ""
    for scope in scopes:
        path.append(scope[len(prev) + 1 :] if prev and scope.startswith(prev + ".") else scope)
        prev = scope
    return ".".join(path)


def no_gradient_message(error: str, model: onnx.ModelProto, trainable: list[str]) -> str | None:
    """One line for ORT's "gradient builder has not been registered" error, else None."""
    match = _NO_GRADIENT.search(error)
    if not match:
        return None
    op, node_name = match.group(1), match.group(2) or ""
    nodes = [n for n in model.graph.node if n.op_type == op and (not node_name or n.name == node_name)]
    needs = downstream(model, set(trainable))
    on_path = [n for n in nodes if any(i in needs for i in n.input)]
    where = (on_path or nodes or [None])[0]
    name = where.name if where is not None else node_name or "?"
    return (
        f"ONNX Runtime 1.19.2 has no gradient for {op} (node {name}, layer {layer_of(name)}), which lies between "
        f"the trainable parameters and the loss: make only parameters after that layer trainable "
        f"(freeze everything before it: {_what_works(model, where)}), or replace the {op} in the model"
    )


def _what_works(model: onnx.ModelProto, node: onnx.NodeProto | None) -> str:
    """Whether the 'classifier' strategy avoids ``node``'s gradient, said as advice."""
    from tasks.errors import RecipeError
    from tasks.prepare.trainable import bn_statistics, find_classifier, float_params

    stats = bn_statistics(model)
    params = {k: v for k, v in float_params(model).items() if k not in stats}
    try:
        names, _ = find_classifier(model, params)
    except RecipeError:
        return "trainable.patterns naming later layers"
    if node is not None and any(i in downstream(model, set(names)) for i in node.input):
        return "trainable.patterns naming layers after it; the classifier alone still needs it"
    return "trainable.strategy = 'classifier' avoids it"
