"""One line for each way the training probe can fail without a pipeline-made message.

- ORT has no CPU kernel for a gradient (``Could not find an implementation for XGrad(1) node with
  name '/layer/Op_Grad/XGrad_0'``): the forward node and its layer, and what to freeze;
- the probe died on a signal (SIGFPE, SIGSEGV, SIGABRT inside ONNX Runtime), leaving no report: the
  signal's name, the check it was running (it says each one on stderr), ORT's last readable line if
  any, and the first node of the model's own graph that dies on the batch it was running (it says
  each batch's first row; in the board batches check it marks each batch's rows, and the line names
  the board's step, epoch and samples), else what to try; never an empty reason;
- anything else: ORT's reason without its C++ positions (:func:`tasks.errors.ort_message`).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from device_agent.job.batch_mark import read_mark
from tasks.errors import ValidationFailed, ort_message
from tasks.prepare.feeds import DataSample, graph_feeds
from tasks.prepare.graph import quiet_session
from tasks.prepare.node_names import layer_of
from tasks.prepare.sandbox.crash_site import first_dying_node, node_words, prefix
from tasks.prepare.sandbox.ort_parent import death

_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'")
_STAGE = re.compile(r"^odl-probe-stage (\w+)$", re.M)
_ROWS = re.compile(r"^odl-probe-rows (\d+)$", re.M)  # the first row of the batch the probe runs
UNNAMED_HINT = (  # no node of the model's own graph dies alone on that batch: no layer to name
    "train fewer layers, nearer the outputs (trainable.strategy = 'classifier', or trainable.train_from "
    "a later node)"
)
FREEZE_HINT = (
    "make only parameters after that layer trainable (trainable.train_from, or trainable.strategy = "
    "'classifier') or freeze the layer"
)


def forward_node(gradient_node: str) -> str:
    """The forward node a gradient node belongs to (``/a/b/Conv_Grad/ConvGrad_0`` -> ``/a/b/Conv``)."""
    parts = gradient_node.split("/")
    for k, part in enumerate(parts):
        if part.endswith("_Grad"):
            return "/".join([*parts[:k], part.removesuffix("_Grad")])
    return gradient_node


_NODE_FAILED = re.compile(
    r"Non-zero status code returned while running (\w+) node\. Name:'([^']*)' Status Message: (.*)"
)


def node_failure(error: str) -> str | None:
    """ORT's "Non-zero status code returned while running X node. Name:'n' Status Message: m" as
    ``X node 'n' (layer L, the gradient of ...) failed: m`` (None for other text)."""
    found = _NODE_FAILED.search(" ".join(ort_message(error).split()))
    if not found:
        return None
    op, node, why = found.groups()
    forward = forward_node(node)
    role = (
        f"in the gradient of {forward}, layer {layer_of(forward)}"
        if forward != node
        else f"layer {layer_of(node)}"
    )
    return f"ONNX Runtime's {op} node '{node}' ({role}) failed: {why.strip()}"


def init_failure_node(model: onnx.ModelProto) -> onnx.NodeProto | None:
    """The first node (graph order) whose presence makes ORT's session creation fail, found by
    bisecting prefixes of the graph (every tensor of a prefix is an output, so nothing is pruned);
    None when the whole graph initialises or no prefix isolates it."""

    def fails(k: int) -> bool:
        try:
            quiet_session(prefix(model, k))
        except Exception as exc:  # noqa: BLE001 - initialisation failures only
            return "initialization" in str(exc).lower()
        return False

    lo, hi = 0, len(model.graph.node)
    if hi == 0 or not fails(hi):
        return None
    while hi - lo > 1:  # fails(hi) and not fails(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fails(mid) else (mid, hi)
    return model.graph.node[hi - 1]


def init_failure(error: str, model_path: Path | None) -> str | None:
    """ORT's "Exception during initialization: <why>" with the node that causes it and its layer."""
    if "Exception during initialization" not in error or model_path is None or not Path(model_path).is_file():
        return None
    node = init_failure_node(onnx.load(str(model_path)))
    if node is None:
        return None
    why = ort_message(error).split("Exception during initialization:")[-1].strip()
    forward = forward_node(node.name)
    return f"ONNX Runtime cannot initialise node '{node.name}' ({node.op_type}, layer {layer_of(forward)}): {why}"


def failed_check(stage: str, error: str, model_path: Path | None = None) -> ValidationFailed:
    """The named check for an exception the probe reported (its ``stage`` and ``error`` text);
    ``model_path``: the training graph, to name the node an initialisation error comes from."""
    failed_init = init_failure(error, model_path)
    if failed_init:
        return ValidationFailed(stage, f"{failed_init}; {FREEZE_HINT}")
    failed_node = node_failure(error)
    if failed_node:
        return ValidationFailed(stage, f"{failed_node}; {FREEZE_HINT}")
    found = _NO_KERNEL.search(error)
    if found:
        op, node = found.group(1), forward_node(found.group(2))
        forward_op = op.removesuffix("Grad")
        return ValidationFailed(
            stage,
            f"ONNX Runtime 1.19.2 has no CPU kernel for the gradient of {forward_op} (node {node}, layer "
            f"{layer_of(node)}), which lies between the trainable parameters and the loss: {FREEZE_HINT}",
        )
    return ValidationFailed(stage, ort_message(error) or error.splitlines()[0])


def crash_check(returncode: int, stderr: str, where: str = "") -> ValidationFailed:
    """The named check for a probe that ended without a report (killed by a signal, or exited);
    ``where``: the node it died in when the parent found it (replaces the general advice)."""
    stages = _STAGE.findall(stderr)
    stage = stages[-1] if stages else "load_artifacts"
    how = (
        f"was killed by {death(returncode)}"
        if returncode < 0
        else f"exited with status {returncode} and no report"
    )
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not _STAGE.match(ln)]
    readable = [ort_message(ln) for ln in lines if "onnxruntime" in ln.lower() or "Error" in ln]
    last = next((r for r in reversed(readable) if r), "")
    detail = f" (last message: {last[:200]})" if last else ""
    advice = where or (
        f"the board's runtime would crash the same way: {UNNAMED_HINT}, or try trainable.batchnorm = 'batch-stats'"
    )
    return ValidationFailed(
        stage,
        f"the training probe {how} inside ONNX Runtime during the {stage.replace('_', ' ')} check{detail}; {advice}",
    )


def where_probe_died(
    out_dir: Path, cfg: dict[str, Any], manifest: dict, proc: subprocess.CompletedProcess
) -> str:
    """For a probe killed by a signal: the batch it was running (:func:`_dying_batch`) run through the
    exported model's own graph in children, bisected for the first node that dies; "" when it did not
    die of a signal, or that graph runs (its gradient or optimizer died) on a batch of its own steps.
    A batch of the board's is named whether the bisection finds a node or not: the board would die on it."""
    if proc.returncode >= 0:
        return ""
    data, rows, board = _dying_batch(cfg, proc.stderr)
    with np.load(data, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    count = len(arrays[manifest["feeds"][manifest["input_names"][0]]])
    picked = {k: a[rows % count] for k, a in arrays.items() if a.ndim and len(a) == count}
    model = onnx.load(str(out_dir / "model.onnx"))
    feeds = graph_feeds(model, len(rows), DataSample(picked, data.name, manifest["feeds"]))
    node, _ = first_dying_node(model, feeds.arrays)
    dies = (
        f"the model's own graph dies first at {node_words(node, proc.returncode)}" if node is not None else ""
    )
    if board:
        return f"{board}; " + (f"run alone on it, {dies}" if dies else BOARD_BATCH_HINT)
    if not dies:
        return ""
    return f"run alone on that batch (rows {rows[0]}-{rows[-1]} of {data.name}), {dies}"


BOARD_BATCH_HINT = "check those samples against what the loss needs (e.g. a count it divides by)"


def _dying_batch(cfg: dict[str, Any], stderr: str) -> tuple[Path, np.ndarray, str]:
    """The data file and rows of the batch a dead probe was running, and, for a batch of the board
    batches check (which marks each: :func:`read_mark`), the board's step, epoch and samples of it;
    else the probe's own (it says each one's first row on stderr: consecutive rows)."""
    plan = cfg.get("board_batches") or {}
    stages = _STAGE.findall(stderr)
    mark = read_mark(Path(plan["mark"])) if plan and stages and stages[-1] == "board_batches" else None
    if mark is None:
        found = _ROWS.findall(stderr)
        return Path(cfg["data"]), (int(found[-1]) if found else 0) + np.arange(cfg["batch_size"]), ""
    data = Path(plan["eval_data"] if mark.phase == "eval" else cfg["data"])
    when = (
        f"at step {mark.step} (epoch {mark.epoch})"
        if mark.phase == "train"
        else f"to evaluate after step {mark.step}"
    )
    return (
        data,
        np.array(mark.rows, np.int64),
        f"the board would die on its batch {when}: {mark.samples(data.name)}",
    )
