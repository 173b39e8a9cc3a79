"""ONNX Runtime on the host for judging: test-set arrays, inference sessions, batched runs, latency.

The lowest layer of host evaluation: :mod:`tasks.judge.losses` runs the prepared eval graph with
:func:`session` and :func:`npz_arrays`, :mod:`tasks.judge.evaluate` runs the inference model with
:func:`run_model`. Sessions use one intra-op thread so latencies are comparable between runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.data.checks import np_dtype
from tasks.errors import EvaluationError
from tasks.quiet import ort_session

LATENCY_SAMPLES = 32


def npz_arrays(path: Path, keys: list[str]) -> dict[str, np.ndarray]:
    """The named arrays of an ``.npz`` test set, naming the file and key when one is missing."""
    if not path.is_file():
        raise EvaluationError(f"test set {path}: file not found")
    with np.load(path) as data:
        for key in keys:
            if key not in data.files:
                raise EvaluationError(f"test set {path}: expected an array '{key}', found {data.files}")
        return {key: data[key] for key in keys}


def load_test_set(test_npz: Path, x_key: str = "x", y_key: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """Load the inputs and labels of a test set, naming the file and key when one is missing."""
    path = Path(test_npz)
    arrays = npz_arrays(path, [x_key, y_key])
    x, y = arrays[x_key], arrays[y_key]
    if len(x) != len(y) or len(x) == 0:
        raise EvaluationError(
            f"test set {path}: expected as many labels as samples (> 0), got {len(x)} / {len(y)}"
        )
    return x, y


def session(model_onnx: Path, model_bytes: bytes | None = None) -> Any:
    """A CPU ``InferenceSession`` of ``model_onnx`` (or of ``model_bytes``, named by it in errors)."""
    try:
        return ort_session(str(model_onnx) if model_bytes is None else model_bytes, threads=1)
    except Exception as exc:  # ORT raises its own types (Fail, InvalidGraph, NoSuchFile...)
        raise EvaluationError(f"model {model_onnx}: ONNX Runtime cannot load it: {exc}") from exc


def input_dtype(sess: Any, name: str) -> np.dtype:
    """The numpy dtype the session's input ``name`` declares (float32 for images, int64 for token
    ids, ...), as the board's agent reads it."""
    arg = next(i for i in sess.get_inputs() if i.name == name)
    return np_dtype(arg.type)


def _pick(names: list[str], wanted: str | None, what: str, model: Path) -> str:
    if wanted is None:
        return names[0]
    if wanted not in names:
        raise EvaluationError(f"model {model}: expected {what} '{wanted}', the graph has {names}")
    return wanted


def run_model(
    model_onnx: Path,
    x: np.ndarray,
    *,
    input_name: str | None = None,
    output_name: str | None = None,
    batch_size: int = 64,
) -> tuple[np.ndarray, float]:
    """Run the model over ``x`` in batches; return the stacked outputs and seconds spent in ``run``."""
    sess = session(model_onnx)
    inp = _pick([i.name for i in sess.get_inputs()], input_name, "input", model_onnx)
    out = _pick([o.name for o in sess.get_outputs()], output_name, "output", model_onnx)
    x = np.asarray(x, dtype=input_dtype(sess, inp))
    chunks, spent = [], 0.0
    for start in range(0, len(x), batch_size):
        t0 = time.perf_counter()
        chunks.append(sess.run([out], {inp: x[start : start + batch_size]})[0])
        spent += time.perf_counter() - t0
    return np.concatenate(chunks), spent


def single_sample_latency_ms(model_onnx: Path, x: np.ndarray, input_name: str | None = None) -> float:
    """Median latency of one-sample inference over the first samples of ``x``, in milliseconds."""
    sess = session(model_onnx)
    inp = _pick([i.name for i in sess.get_inputs()], input_name, "input", model_onnx)
    x = np.asarray(x[:LATENCY_SAMPLES], dtype=input_dtype(sess, inp))
    sess.run(None, {inp: x[:1]})  # warm-up
    times = []
    for i in range(len(x)):
        t0 = time.perf_counter()
        sess.run(None, {inp: x[i : i + 1]})
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(np.median(times))
