"""The judging rehearsal of validation: what the host does with a trained model, done on the host
before anything reaches a board.

Validation's probe trains a few steps and exports an inference model exactly as the board does
(``validation_inference.onnx``). :func:`rehearse_judging` evaluates it as the judge will (the
recipe's loss and metrics, a detector's decoding and mAP) on the first few samples of the test set
and of every extra test set, and quantizes it to int8 when the recipe has ``[quantize]``, so a
recipe that passes ``odl prepare`` does not fail after training for a reason the host could see.
It lives above :mod:`tasks.prepare` (it needs the judge) and reaches the pipeline as its
``rehearse`` hook, which runs in the folder being prepared, before it is renamed into place.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import PipelineError, ValidationFailed, ort_message
from tasks.judge.evaluate import evaluate
from tasks.judge.losses import host_loss
from tasks.judge.quantize import quantize_int8
from tasks.prepare import Prepared
from tasks.recipe.datafiles import load_arrays
from tasks.recipe.schema import Recipe
from tasks.stages.judge import int8_loss

log = logging.getLogger(__name__)
SAMPLES = 16  # per test set: enough to run every code path, small enough for seconds
INT8_CALIBRATION = 16


def _head(path: Path, out: Path, n: int) -> Path:
    """The first ``n`` samples of every per-sample array of an ``.npz`` file, written to ``out``."""
    arrays = load_arrays(path)
    size = len(arrays["x"]) if "x" in arrays else None
    np.savez(out, **{k: (a[:n] if a.ndim and len(a) == size else a) for k, a in arrays.items()})
    return out


def _failed(check: str, what: str, exc: Exception) -> ValidationFailed:
    """The named check for ``exc``: a pipeline error's own line, ORT's reason, or the exception's."""
    if isinstance(exc, PipelineError):
        return ValidationFailed(check, f"{what}: {exc}")
    reason = ort_message(str(exc)) or (str(exc).splitlines() or [""])[0]
    return ValidationFailed(check, f"{what}: {type(exc).__name__}: {reason}")


def rehearse_judging(recipe: Recipe, prep: Prepared) -> dict[str, Any]:
    """Evaluate the probe's inference model on ``SAMPLES`` of each test set and quantize it when
    asked; returns the figures per set (and ``int8``), or raises the ValidationFailed check
    ``host_evaluation`` / ``int8_quantization`` naming the set or the step."""
    model = prep.out_dir / "validation_inference.onnx"
    loss = host_loss(recipe, prep)
    detector = {"detection": recipe.detection, "priors": prep.priors} if recipe.detection else {}
    sets = {"test": recipe.data.test, **recipe.data.extra_tests}
    report: dict[str, Any] = {"samples": SAMPLES}
    with tempfile.TemporaryDirectory(prefix=".rehearse-", dir=prep.out_dir) as tmp:
        small = {name: _head(Path(path), Path(tmp) / f"{name}.npz", SAMPLES) for name, path in sets.items()}
        for name, path in small.items():
            field = "data.test" if name == "test" else f"data.extra_tests.{name}"
            try:
                metrics = evaluate(model, path, recipe.task, loss=loss, **detector)
            except Exception as exc:  # noqa: BLE001 - every failure becomes the named check
                raise _failed("host_evaluation", f"evaluating on {field} ({sets[name]})", exc) from exc
            report[name] = {k: metrics[k] for k in ("loss", "loss_kind") if k in metrics}
        if recipe.quantize:
            spec = dataclasses.replace(
                recipe.quantize, samples=min(recipe.quantize.samples, INT8_CALIBRATION)
            )
            try:
                int8 = quantize_int8(model, spec, Path(tmp) / "int8.onnx")
                evaluate(
                    Path(int8["path"]),
                    small["test"],
                    recipe.task,
                    loss=int8_loss(recipe, loss),
                    batch_size=1,
                    **detector,
                )
            except Exception as exc:  # noqa: BLE001 - every failure becomes the named check
                raise _failed(
                    "int8_quantization", "quantizing the trained model to int8 ([quantize])", exc
                ) from exc
            report["int8"] = {
                k: int8[k] for k in ("size_bytes", "quantize_linear", "dequantize_linear") if k in int8
            }
    log.info("judging rehearsed on %d samples of %s", SAMPLES, ", ".join(sets))
    return report
