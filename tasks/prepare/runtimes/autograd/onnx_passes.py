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
    rewriter.RewritePass(rewriter._DEFAULT_REWRITE_RULES)(model)  # onnxscript's own default rule set
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
