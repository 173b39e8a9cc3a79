"""The ONNX versions of the pipeline: the opset the exporter writes, the newest IR and opset the
board's ONNX Runtime 1.19.2 loads, the check that a graph of either runtime stays within them, and
sub-graph extraction as both pinned onnx releases do it (1.17.0 on Python 3.11, 1.18.0 on 3.12/3.13)."""

from __future__ import annotations

import onnx

from tasks.errors import ArtifactError

OPSET = 17  # torch.onnx.export's opset_version
MAX_IR = 10
MAX_OPSET = 21


def onnx_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset a model imports."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def check_board_loadable(model: onnx.ModelProto, what: str) -> None:
    """ArtifactError if ORT 1.19.2 (the board's) could not load ``model`` (IR > 10 or opset > 21)."""
    if model.ir_version > MAX_IR:
        raise ArtifactError(
            f"{what} has ONNX IR version {model.ir_version}; ORT 1.19.2 on the board loads "
            f"IR <= {MAX_IR} (was it written by onnx >= 1.18? pin onnx==1.17.0)"
        )
    if onnx_opset(model) > MAX_OPSET:
        raise ArtifactError(
            f"{what} uses opset {onnx_opset(model)}; ORT 1.19.2 on the board supports "
            f"opset <= {MAX_OPSET} (export with opset 17)"
        )


def extractor(model: onnx.ModelProto) -> onnx.utils.Extractor:
    """``onnx.utils.Extractor`` over ``model`` with its shapes inferred first: onnx 1.17 inferred them
    inside, 1.18 no longer does, and its ``extract_model`` then fails with a KeyError on a tensor
    without value_info (every intermediate of a TorchScript export)."""
    return _Extractor(onnx.shape_inference.infer_shapes(model))


class _Extractor(onnx.utils.Extractor):
    """``onnx.utils.Extractor`` whose walk back from the outputs visits each node once: the
    library's scans every node left for each tensor it meets, quadratic in the graph (27 s of a
    6 600-node prefix's extraction). The same nodes, in the graph's order."""

    def _collect_reachable_nodes(
        self, input_names: list[str], output_names: list[str]
    ) -> list[onnx.NodeProto]:
        nodes = list(self.graph.node)
        producer = {o: i for i, node in enumerate(nodes) for o in node.output if o}
        stop, seen, reachable = set(input_names), set(), set()
        stack = list(output_names)
        while stack:
            name = stack.pop()
            if name in stop or name in seen:
                continue
            seen.add(name)
            index = producer.get(name)
            if index is not None and index not in reachable:
                reachable.add(index)
                stack.extend(nodes[index].input)
        return [nodes[i] for i in sorted(reachable)]
