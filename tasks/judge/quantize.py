"""Static int8 quantization of a float inference model for the board's NPU, and its verdict.

The STM32MP2's NPU runs int8 models with static shapes, so :func:`quantize_int8` first fixes the
batch axis to 1 (:func:`fixed_batch`), runs ONNX Runtime's quantization pre-processing (symbolic
shape inference, basic graph optimisation such as folding a frozen BatchNorm's Mul/Add into its
Conv, ONNX shape inference), then ``quantize_static`` in QDQ format with int8 weights and int8
activations. Activation ranges are calibrated on the first ``quantize.samples`` samples of the
recipe's calibration set (an ``.npz`` with an array ``x``), fed one at a time, in chunks so that
the intermediate outputs ONNX Runtime keeps stay small for large models.

:func:`int8_verdict` compares the int8 model's metrics with the float model's (both from
:func:`tasks.judge.evaluate.evaluate`; a batch-1 model needs ``batch_size=1``) against
``quantize.max_drop``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import EvaluationError, RecipeError, ort_message
from tasks.judge.calibration import Reader, calibration_inputs, chunk
from tasks.judge.direction import LOWER_IS_BETTER
from tasks.judge.runtime import session
from tasks.quiet import library_logs_at_debug, quiet_onnxruntime
from tasks.recipe.extras import QUANT_METHODS, QuantizeSpec

log = logging.getLogger(__name__)

# quant_pre_process options, tried in this order until one works (the last skips every step)
PRE_PROCESS_ATTEMPTS: tuple[dict[str, bool], ...] = (
    {},
    {"skip_symbolic_shape": True},
    {"skip_symbolic_shape": True, "skip_optimization": True},
)


def fixed_batch(model_onnx: Path, out: Path, batch: int = 1) -> Path:
    """Write a copy of the model whose graph inputs and outputs have dim 0 fixed to ``batch``.

    Intermediate shapes are inferred again from the fixed inputs (strictly: a graph that cannot
    run at this batch size is refused) and the result passes ``onnx.checker``.
    """
    import onnx  # onnx only when [quantize] runs

    if batch < 1:
        raise EvaluationError(f"fixed_batch: expected a batch size >= 1, got {batch}")
    model = _load_onnx(Path(model_onnx))
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if len(dims) == 0:
            raise EvaluationError(
                f"model {model_onnx}: graph input/output '{value.name}' has no batch axis to fix"
            )
        dims[0].Clear()
        dims[0].dim_value = batch
    del model.graph.value_info[:]  # inferred again below, with the fixed batch
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        onnx.checker.check_model(model)
    except Exception as exc:
        raise EvaluationError(
            f"model {model_onnx}: not valid with its batch fixed to {batch}: {exc}"
        ) from exc
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return out


def quantize_int8(model_onnx: Path, spec: QuantizeSpec, out: Path) -> dict[str, Any]:
    """Quantize a float inference model to a static int8 QDQ model with batch 1, written to ``out``.

    Returns what was done: ``path``, ``size_bytes``, ``float_size_bytes``, ``method``,
    ``per_channel``, ``samples`` (calibration samples used), ``pre_process`` (the ORT
    pre-processing steps skipped, if any) and the counts ``quantize_linear`` and
    ``dequantize_linear`` of QDQ nodes.
    """
    from onnxruntime.quantization import (  # ORT quantization (heavy) only when [quantize] runs
        QuantFormat,
        QuantType,
        quantize_static,
    )

    model_onnx, out = Path(model_onnx), Path(out)
    method = _calibrate_method(spec.method)
    if spec.samples < 1:
        raise RecipeError("quantize.samples", "an integer >= 1", spec.samples)
    input_name, input_shape, input_dtype = _model_input(model_onnx)
    x = calibration_inputs(spec.calibration, spec.samples, input_shape, input_dtype)
    reader = Reader(input_name, x)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".quantize-", dir=out.parent) as tmp:  # beside out: atomic rename
        work = Path(tmp)
        prepared, skipped = _pre_process(fixed_batch(model_onnx, work / "batch1.onnx"), work)
        staged = work / "int8.onnx"
        try:
            with _ort_prints_to_log():
                quantize_static(
                    str(prepared),
                    str(staged),
                    reader,
                    quant_format=QuantFormat.QDQ,
                    per_channel=spec.per_channel,
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=method,
                    extra_options={"CalibStridedMinMax": chunk(len(x))},
                )
        except Exception as exc:  # ORT raises ValueError, RuntimeError, its own Fail, ...
            raise EvaluationError(
                f"model {model_onnx}: ONNX Runtime could not quantize it to int8 "
                f"(quantize.method {spec.method!r}): {type(exc).__name__}: {ort_message(str(exc))}"
            ) from exc
        counts = _qdq_counts(staged, model_onnx)
        session(out, staged.read_bytes())  # refuses (EvaluationError) a model ORT would not load
        os.replace(staged, out)
    result = {
        "path": str(out),
        "size_bytes": out.stat().st_size,
        "float_size_bytes": model_onnx.stat().st_size,
        "method": spec.method,
        "per_channel": spec.per_channel,
        "samples": len(x),
        "pre_process": skipped,
        **counts,
    }
    log.info("quantized %s to int8: %s", model_onnx.name, result)
    return result


def int8_verdict(
    float_metrics: dict[str, Any], int8_metrics: dict[str, Any], metric: str, max_drop: float | None
) -> dict[str, Any]:
    """Whether the int8 model's ``metric`` stays within ``max_drop`` of the float model's.

    The drop is measured in the metric's worse direction (float - int8 for accuracy-like metrics,
    int8 - float for losses and errors), so a negative drop means the int8 model did better.
    """
    for side, metrics in (("float", float_metrics), ("int8", int8_metrics)):
        value = metrics.get(metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            numbers = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))
            raise EvaluationError(
                f"metric '{metric}': the {side} model's metrics have no such number (have {numbers})"
            )
    f, q = float(float_metrics[metric]), float(int8_metrics[metric])
    lower_is_better = metric in LOWER_IS_BETTER
    drop = q - f if lower_is_better else f - q
    holds = max_drop is None or drop <= max_drop
    worse = "above" if lower_is_better else "below"
    better = "below" if lower_is_better else "above"
    change = f"{drop:.4f} {worse}" if drop >= 0 else f"{-drop:.4f} {better}"
    reason = f"int8 {metric} {q:.4f} is {change} the float model's {f:.4f}"
    if max_drop is None:
        reason += ", no quantize.max_drop set"
    else:
        reason += f", {'within' if holds else 'beyond'} quantize.max_drop {max_drop:.4f}"
    return {
        "metric": metric,
        "float": f,
        "int8": q,
        "drop": drop,
        "max_drop": max_drop,
        "holds": holds,
        "reason": reason,
    }


def _calibrate_method(method: str) -> Any:
    from onnxruntime.quantization import (
        CalibrationMethod,  # ORT quantization (heavy) only when [quantize] runs
    )

    methods = dict(zip(QUANT_METHODS, ("MinMax", "Entropy", "Percentile"), strict=True))
    if method not in methods:
        raise RecipeError("quantize.method", " or ".join(repr(m) for m in QUANT_METHODS), method)
    return CalibrationMethod[methods[method]]


def _load_onnx(model_onnx: Path) -> Any:
    import onnx  # onnx only when [quantize] runs

    if not model_onnx.is_file():
        raise EvaluationError(f"model {model_onnx}: file not found")
    try:
        return onnx.load(str(model_onnx))
    except Exception as exc:
        raise EvaluationError(f"model {model_onnx}: not a readable ONNX model: {exc}") from exc


def _model_input(model_onnx: Path) -> tuple[str, tuple[int | str, ...], np.dtype]:
    """The name, sample shape (without the batch axis; names for free axes) and numpy dtype of
    the model's single graph input."""
    import onnx  # onnx only when [quantize] runs

    graph = _load_onnx(model_onnx).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise EvaluationError(
            f"model {model_onnx}: quantization calibrates one input from quantize.calibration's x, "
            f"the model has {len(inputs)}: {[i.name for i in inputs]}"
        )
    tensor = inputs[0].type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
    if not dims:
        raise EvaluationError(f"model {model_onnx}: input '{inputs[0].name}' has no batch axis")
    return inputs[0].name, dims[1:], np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))


def _pre_process(model_onnx: Path, work: Path) -> tuple[Path, str]:
    """ORT's quantization pre-processing, skipping the steps that fail; returns the model to
    quantize and which steps were skipped ("" when none)."""
    from onnxruntime.quantization.shape_inference import (
        quant_pre_process,  # ORT quantization (heavy) only when [quantize] runs
    )

    for options in PRE_PROCESS_ATTEMPTS:
        out = work / f"pre{len(options)}.onnx"
        try:
            with _ort_prints_to_log():
                quant_pre_process(str(model_onnx), str(out), **options)
            if out.is_file():
                return out, ", ".join(options)
        except Exception as exc:  # symbolic shape inference or the optimiser refused the graph
            log.warning("quantization pre-processing (%s) failed: %s", ", ".join(options) or "all steps", exc)
    log.warning("quantization pre-processing skipped: quantizing %s as it is", model_onnx.name)
    return model_onnx, "all"


def _qdq_counts(model_onnx: Path, source: Path) -> dict[str, int]:
    """QuantizeLinear/DequantizeLinear node counts; a model without any was not quantized."""
    import onnx  # onnx only when [quantize] runs

    ops = [n.op_type for n in onnx.load(str(model_onnx), load_external_data=False).graph.node]
    counts = {
        "quantize_linear": ops.count("QuantizeLinear"),
        "dequantize_linear": ops.count("DequantizeLinear"),
    }
    if counts["quantize_linear"] == 0:
        raise EvaluationError(
            f"model {source}: ONNX Runtime quantized no tensor of it (its ops: {sorted(set(ops))})"
        )
    return counts


@contextlib.contextmanager
def _ort_prints_to_log():
    """ORT's quantization tools print progress to stdout and log warnings on the root logger
    ("Bias ... has already been marked for quantization", once per shared bias); both go to the
    debug log instead, and the sessions they build log errors only."""
    quiet_onnxruntime()
    text = io.StringIO()
    with contextlib.redirect_stdout(text), library_logs_at_debug("onnxruntime", log):
        yield
    if text.getvalue().strip():
        log.debug("onnxruntime.quantization: %s", " | ".join(text.getvalue().split("\n")).strip(" |"))
