"""ONNX Runtime prints nothing of its own while preparation runs a graph: every session the host's
preparation builds logs errors only (a graph with an unused initializer, as Swin V2's step has,
made ONNX Runtime print graph.cc warnings on a passing ``odl prepare``)."""

from __future__ import annotations

import re
import subprocess
import sys

from tasks.paths import PROJECT_ROOT

PROGRAM = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tasks.prepare.runtimes.autograd.prefix_split import _run

unused = numpy_helper.from_array(np.ones(3, np.float32), "unused")
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [unused])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
print(_run(model, {"x": np.array([-1.0, 2.0], np.float32)})["y"].tolist())
"""


def test_the_frozen_prefix_split_runs_its_graphs_without_onnx_runtime_warnings():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, cwd=PROJECT_ROOT,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 2.0]"
    assert "graph.cc" not in out.stderr and "unused" not in out.stderr, out.stderr


def test_every_session_preparation_builds_says_its_severity():
    """Each ``InferenceSession(`` of tasks/ is given options (whose severity is errors) or is
    :func:`tasks.quiet.ort_session`'s."""
    for path in (PROJECT_ROOT / "tasks").rglob("*.py"):
        text = path.read_text()
        for call in re.finditer(r"InferenceSession\(([^()]*(?:\([^()]*\))?[^()]*)\)", text):
            assert "options" in call.group(1), f"{path.relative_to(PROJECT_ROOT)}: {call.group(0)}"
