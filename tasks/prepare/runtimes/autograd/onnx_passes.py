"""The clean-up of an exported step graph: the passes of ``torch.onnx.export(optimize=True)``
(onnxscript's optimizer), ordered so the costly one runs on the small graph.

The exporter writes a step as thousands of nodes, most of them shape arithmetic on the symbolic
batch that constant folding removes (a U-Net's train step: 6 715 nodes, 923 after folding).
onnxscript's optimizer runs its pattern rewriter on the graph as exported, where matching costs
time that grows with the graph: 115 of its 121 s on that step. Folding first (1.6 s), then
rewriting (1.6 s) gives the same graph to 3 % of its nodes (899 against 876) and the same speed in
ONNX Runtime (77.1 against 76.5 ms per step, medians of 5 interleaved runs).

:func:`unfused_pads` then keeps ONNX Runtime's PadFusion (1.19.2, every optimisation level from
basic) from merging a zero Pad into the pool after it where that changes the step: it adds the Pad's
amounts to the pool's ``pads``, so a pad at least the kernel (a shake-shake shortcut's
``ZeroPad2d((1, 0, 1, 0))`` before ``AvgPool2d(1, stride=2)``) stops the session ("Pad should be
smaller than kernel"), a MaxPool pads with -inf where the zeros were values, and an AveragePool
that does not count padding divides by fewer elements.

:func:`serial_scatter_adds` rewrites each ``ScatterND(reduction="add")`` (an ``index_put`` with
``accumulate``: the backward of an indexing, of a bilinear or nearest upsampling as PyTorch
decomposes it, of an embedding) as a ScatterElements adding along one flat axis. ONNX Runtime 1.19.2
spreads a ScatterND's updates over its threads and adds them without atomics, so updates of one
index on two threads are lost: smp's FPN's bilinear upsampling backward (ScatterND of [16, 16, 7,
128] updates into [8, 8, 7, 128]) gave a GroupNorm's bias gradient 0.0226 (relative) apart between
two runs of one session; ScatterElements adds serially (0 in 20 runs where ScatterND lost up to 3
of 64 updates of a row).
"""

from __future__ import annotations

from typing import Any

POOLS = {"AveragePool", "MaxPool"}
FOLDS = 2  # constant folding and dead-node removal, as many rounds as onnxscript's optimizer runs


def optimize(model: Any) -> None:
    """Clean up the ``onnx_ir`` model of an exported program in place: inline functions, fold
    constants, rewrite, remove what is unused, lift constants, deduplicate and name."""
    import onnx_ir.passes.common as common  # the passes onnxscript's optimizer is made of
    from onnxscript import optimizer, rewriter

    common.InlinePass()(model)
    for _ in range(FOLDS):
        optimizer.fold_constants(model)
        common.RemoveUnusedNodesPass()(model)
    rewriter.RewritePass(linear_rules())(model)
    optimizer.fold_constants(model)
    for step in (
        common.RemoveUnusedNodesPass(),
        common.RemoveUnusedFunctionsPass(),
        common.RemoveUnusedOpsetsPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(),
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.OutputFixPass(),
        common.NameFixPass(),
    ):
        step(model)
    unfused_pads(model)
    serial_scatter_adds(model)


def linear_rules() -> list[Any]:
    """onnxscript's default rewrite rules without those whose pattern has several output nodes
    (``SlicesSplit``: two Slices of one input as a Split): their matcher lists the whole graph for
    each candidate node, quadratic in the step's size (62 s of timm's coat_tiny's 188 s preparation,
    2-core host; the other rules together under 1 s)."""
    from onnxscript import rewriter

    return [r for r in rewriter._DEFAULT_REWRITE_RULES if len(r._target_pattern.output_nodes) == 1]


def unfused_pads(model: Any) -> int:
    """Drop the all-zero ``pads`` attribute (ONNX's default) of each pool that reads a zero Pad,
    directly or through a Cast, where ONNX Runtime's PadFusion would change it (see the module's
    docstring): that fusion only takes a pool with the attribute. Left fusable: an AveragePool
    counting its padding whose Pad amounts are constant and each below the kernel. Returns how
    many pools were changed."""
    changed = 0
    for node in model.graph:
        pads = node.attributes.get("pads")
        if node.domain not in ("", "ai.onnx") or node.op_type not in POOLS or pads is None:
            continue
        if any(pads.as_ints()) or not node.inputs or node.inputs[0] is None:
            continue
        source = node.inputs[0].producer()
        if source is not None and source.op_type == "Cast" and source.inputs[0] is not None:
            source = source.inputs[0].producer()
        if source is None or source.op_type != "Pad" or _fusion_exact(node, source):
            continue
        del node.attributes["pads"]
        changed += 1
    return changed


def _fusion_exact(pool: Any, pad: Any) -> bool:
    """Whether merging ``pad`` into ``pool`` computes the same: an AveragePool that counts padding,
    the Pad's amounts constant and each below the pool's kernel on its axis."""
    include = pool.attributes.get("count_include_pad")
    if pool.op_type != "AveragePool" or include is None or not include.as_int():
        return False
    amounts = pad.inputs[1].const_value if len(pad.inputs) > 1 and pad.inputs[1] is not None else None
    kernel = pool.attributes.get("kernel_shape")
    if amounts is None or kernel is None:
        return False
    values, k = [int(v) for v in amounts.numpy().reshape(-1)], kernel.as_ints()
    half = len(values) // 2
    spatial = values[2:half] + values[half + 2 :]  # the batch and channel axes' amounts first
    return len(spatial) == 2 * len(k) and all(v < k[i % len(k)] for i, v in enumerate(spatial))


def unfused_pads_proto(model: Any) -> int:
    """:func:`unfused_pads` on an ``onnx.ModelProto`` (a TorchScript export: the inference
    template) in place; its Pad amounts, Constant nodes there, count as unknown."""
    producer = {out: node for node in model.graph.node for out in node.output}
    changed = 0
    for node in model.graph.node:
        pads = next((a for a in node.attribute if a.name == "pads"), None)
        if node.domain not in ("", "ai.onnx") or node.op_type not in POOLS or pads is None or any(pads.ints):
            continue
        source = producer.get(node.input[0]) if node.input else None
        if source is not None and source.op_type == "Cast":
            source = producer.get(source.input[0])
        if source is None or source.op_type != "Pad":
            continue
        node.attribute.remove(pads)
        changed += 1
    return changed


def serial_scatter_adds(model: Any) -> int:
    """Rewrite each ``ScatterND(data, indices, updates, reduction="add")`` of ``model`` (``onnx_ir``)
    whose indices' last axis is known as ScatterElements
    (:func:`_flat_scatter_add`). Returns how many were rewritten (see the module's docstring for why)."""
    from onnx_ir import convenience

    changed = 0
    for node in list(model.graph):
        reduction = node.attributes.get("reduction")
        if node.domain not in ("", "ai.onnx") or node.op_type != "ScatterND" or reduction is None:
            continue
        data, indices, updates = node.inputs
        known = indices.shape if indices.shape is not None else getattr(indices.const_value, "shape", None)
        if reduction.as_string() != "add" or not known or not isinstance(known[-1], int) or known[-1] < 1:
            continue
        new, result = _flat_scatter_add(data, indices, updates, known[-1])
        convenience.replace_nodes_and_values(model.graph, node, [node], new, node.outputs, [result])
        changed += 1
    return changed


def _flat_scatter_add(data: Any, indices: Any, updates: Any, k: int) -> tuple[list[Any], Any]:
    """The nodes of ``ScatterND(data, indices, updates, reduction="add")`` as a ScatterElements
    along one axis, and their result: data as ``[prod(shape[:k]), prod(shape[k:])]``, each index row
    as its flat position (negative ones wrapped) repeated along the trailing axis, updates as
    ``[-1, prod(shape[k:])]`` (the size over the rows: no product of a possibly empty slice); the
    sums reshaped back."""
    import numpy as np
    import onnx_ir as ir

    new: list[Any] = []

    def add(op: str, inputs: list[Any], **attrs: Any) -> Any:
        new.append(ir.node(op, inputs, attrs or None))
        return new[-1].outputs[0]

    def constant(values: list[int]) -> Any:
        return add("Constant", [], value=ir.tensor(np.array(values, dtype=np.int64)))

    shape = add("Shape", [data])
    flat = None
    for j in range(k):
        dim = add("Slice", [shape, constant([j]), constant([j + 1])])
        index = add("Gather", [indices, constant([j])], axis=-1)
        index = add("Mod", [add("Add", [index, dim]), dim])  # -dim..dim-1 as 0..dim-1
        flat = index if flat is None else add("Add", [add("Mul", [flat, dim]), index])
    rows = add("ReduceProd", [add("Slice", [shape, constant([0]), constant([k])])], keepdims=1)
    width = add("Div", [add("ReduceProd", [shape], keepdims=1), rows])
    table = add("Reshape", [data, add("Concat", [rows, width], axis=0)])
    values = add("Reshape", [updates, add("Concat", [constant([-1]), width], axis=0)])
    positions = add("Expand", [add("Reshape", [flat, constant([-1, 1])]), add("Shape", [values])])
    summed = add("ScatterElements", [table, positions, values], axis=0, reduction="add")
    return new, add("Reshape", [summed, shape])
