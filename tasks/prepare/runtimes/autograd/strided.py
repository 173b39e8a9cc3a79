"""``aten.as_strided_scatter`` as an index scatter over the flat input, which ONNX has.

A forward that restrides a tensor (``as_strided``: an adaptive 1d pool's output, a window view) has a
backward that writes the gradient through the same strides into a zeroed storage; the exporter's
functionalisation makes that write ``as_strided_scatter``, which PyTorch decomposes only into its
primitive ``prims.as_strided_scatter`` and the ONNX exporter converts neither. Over a contiguous
input the storage is the input flattened, so the write is a scatter at the flat positions
``offset + sum(i_k * stride_k)`` of the view's elements (ScatterElements). :mod:`.op_checks`
compares it with PyTorch's kernel on each configuration a step uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def flat_positions(size: Sequence[Any], stride: Sequence[Any], offset: Any) -> Any:
    """The storage position of each element of the view ``(size, stride, offset)``, of shape ``size``."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    index = torch.full([1] * len(size), offset, dtype=torch.int64)
    for axis, (n, s) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[axis] = -1
        index = index + (torch.arange(n, dtype=torch.int64) * s).reshape(shape)
    return index.expand(list(size))


def as_strided_scatter(inp: Any, src: Any, size: Sequence[Any], stride: Sequence[Any],
                       storage_offset: Any = None) -> Any:  # fmt: skip
    """``aten.as_strided_scatter``: ``inp`` with ``src`` written into its view ``(size, stride,
    storage_offset)``; PyTorch's operator itself (NotImplemented) when ``inp`` is not contiguous,
    as its storage is then not the input flattened."""
    if not inp.is_contiguous():
        return NotImplemented
    index = flat_positions(size, stride, storage_offset or 0).reshape(-1)
    flat = inp.reshape(-1).scatter(0, index, src.reshape(-1).to(inp.dtype))
    return flat.reshape(inp.shape)
