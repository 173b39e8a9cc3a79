"""Checks run before the first step: the data must fit the model's inputs and label range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from device_agent.data.readers import InputSpec
from device_agent.errors import AgentError
from device_agent.ort import load_onnxruntime
from device_agent.protocol import ExitCode

ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
CHUNK_ROWS = 4096
MASK_CHUNK = 1 << 20  # mask pixels checked at once (8 MB of int64)


def np_dtype(ort_type: str) -> np.dtype:
    """The numpy dtype of an ORT tensor type (``"tensor(float)"`` -> float32); float32 when unknown."""
    return np.dtype(ORT_DTYPES.get(ort_type, np.float32))


def model_io(eval_model: str | bytes | Path, input_names: list[str]) -> tuple[list[InputSpec], int | None]:
    """The user inputs of the eval graph (a file, or a serialised model) and the class count of its
    logits output (None if unknown).

    The logits are the eval graph's second output (the first is the loss) when the artifacts were
    generated with the model outputs kept.
    """
    ort = load_onnxruntime()
    try:
        source = eval_model if isinstance(eval_model, bytes) else str(eval_model)
        sess = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises several exception types
        raise AgentError(ExitCode.ARTIFACT_INVALID, f"artifacts.eval_model: does not load: {exc}") from exc
    by_name = {i.name: i for i in sess.get_inputs()}
    specs = []
    for name in input_names:
        arg = by_name[name]
        specs.append(InputSpec.of(name, arg.shape, np_dtype(arg.type)))
    outs = sess.get_outputs()
    classes = outs[1].shape[-1] if len(outs) > 1 and outs[1].shape else None
    return specs, classes if isinstance(classes, int) else None


def check_dataset(ds: Any, inputs: list[InputSpec], task: str, classes: int | None, field: str,
                  ignore_index: int | None = None) -> None:  # fmt: skip
    """Raise DATA_MISMATCH when shapes, dtypes, NaNs or label ranges do not fit the model (a
    segmentation mask's pixels: classes or ``ignore_index``)."""
    if len(ds) == 0:
        raise AgentError(ExitCode.DATA_MISMATCH, f"{field}: the dataset is empty", field)
    arrays, n = getattr(ds, "arrays", None), len(ds)
    if arrays is None:  # image folders: check one decoded batch, and the labels of every file
        arrays = ds.take(np.arange(min(2, n)))
        n = len(arrays[inputs[0].name])
    for spec in inputs:
        _check_array(arrays[spec.name], spec, n, field)
    if len(inputs) > 1 and task in ("classification", "binary"):
        labels = getattr(ds, "labels", None)
        labels = arrays[inputs[1].name] if labels is None else labels
        _check_labels(labels, task, classes, f"{field}: input {inputs[1].name!r}", field)
    if len(inputs) > 1 and task == "keypoints":
        _check_visibility(arrays[inputs[1].name], f"{field}: input {inputs[1].name!r}", field)
    if len(inputs) > 1 and task == "segmentation":
        _check_masks(
            arrays[inputs[1].name], classes, ignore_index, f"{field}: input {inputs[1].name!r}", field
        )


def _check_array(arr: Any, spec: InputSpec, n: int, field: str) -> None:
    where = f"{field}: input {spec.name!r}"
    if len(arr) != n and getattr(arr, "ndim", 0) > 0:
        raise AgentError(ExitCode.DATA_MISMATCH, f"{where}: {len(arr)} rows, other inputs have {n}", field)
    if arr.ndim != len(spec.shape):
        raise AgentError(
            ExitCode.DATA_MISMATCH,
            f"{where}: expected {len(spec.shape)} dims {spec.shape_text()}, got shape {tuple(arr.shape)}",
            field,
        )
    for axis, (want, got) in enumerate(zip(spec.shape[1:], arr.shape[1:], strict=True), 1):
        if want is not None and want != got:
            raise AgentError(
                ExitCode.DATA_MISMATCH,
                f"{where}: expected shape {spec.shape_text()}, got {tuple(arr.shape)} (axis {axis}: "
                f"{got}, the model's input takes {want})",
                field,
            )
    if np.dtype(arr.dtype).kind != spec.dtype.kind and not (spec.dtype.kind == "i" and arr.dtype.kind == "u"):
        raise AgentError(
            ExitCode.DATA_MISMATCH, f"{where}: expected dtype {spec.dtype}, got {arr.dtype}", field
        )
    if arr.dtype.kind == "f":
        for start in range(0, len(arr), CHUNK_ROWS):
            if not np.isfinite(arr[start : start + CHUNK_ROWS]).all():
                raise AgentError(ExitCode.DATA_MISMATCH, f"{where}: contains NaN or inf values", field)


def _check_labels(labels: Any, task: str, classes: int | None, where: str, field: str) -> None:
    lo, hi = float(np.min(labels)), float(np.max(labels))
    if task == "binary" and (lo < 0 or hi > 1):
        raise AgentError(
            ExitCode.DATA_MISMATCH, f"{where}: binary labels must be in [0, 1], got [{lo:g}, {hi:g}]", field
        )
    if task == "classification":
        top = f"{classes - 1}" if classes else "num_classes-1"
        if lo < 0 or (classes is not None and hi >= classes):
            raise AgentError(
                ExitCode.DATA_MISMATCH,
                f"{where}: labels must be in [0, {top}] (model has {classes} classes), got [{lo:g}, {hi:g}]",
                field,
            )


def _check_masks(labels: Any, classes: int | None, ignore: int | None, where: str, field: str) -> None:
    """Every pixel label a class in [0, classes) or ``ignore``, read a few MB at a time."""
    rows = max(1, MASK_CHUNK // max(1, int(np.prod(labels.shape[1:]))))
    for start in range(0, len(labels), rows):
        part = np.asarray(labels[start : start + rows])
        bad = (part < 0) | (part >= (classes if classes else np.iinfo(np.int64).max))
        if ignore is not None:
            bad &= part != ignore
        if bad.any():
            top = f"{classes - 1}" if classes else "num_classes-1"
            first = start + int(np.argwhere(bad)[0][0])
            raise AgentError(
                ExitCode.DATA_MISMATCH,
                f"{where}: mask pixels must be classes in [0, {top}] or the ignore index {ignore}, got "
                f"{np.unique(part[bad])[:5].tolist()} (sample {first})",
                field,
            )


def _check_visibility(labels: Any, where: str, field: str) -> None:
    """Keypoint labels ``[N, K, 3]``: each visibility (the last value) 0, 1 or 2, as COCO's."""
    if getattr(labels, "ndim", 0) != 3 or labels.shape[-1] != 3:
        raise AgentError(ExitCode.DATA_MISMATCH, f"{where}: expected keypoints (N, K, 3), got shape "
                         f"{tuple(getattr(labels, 'shape', ()))}", field)  # fmt: skip
    for start in range(0, len(labels), CHUNK_ROWS):
        v = np.asarray(labels[start : start + CHUNK_ROWS])[..., 2]
        bad = (v != 0) & (v != 1) & (v != 2)
        if bad.any():
            raise AgentError(
                ExitCode.DATA_MISMATCH,
                f"{where}: keypoint visibility must be 0, 1 or 2, got {np.unique(v[bad])[:5].tolist()} "
                f"(sample {start + int(np.argwhere(bad)[0][0])})",
                field,
            )
