"""The ONNX versions of the pipeline: the opset the exporter writes, and the newest IR and opset
the board's ONNX Runtime 1.19.2 loads."""

from __future__ import annotations

OPSET = 17  # torch.onnx.export's opset_version
MAX_IR = 10
MAX_OPSET = 21
