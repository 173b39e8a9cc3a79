"""The judging rehearsal of validation: what the host does with a trained model, done on the host
before anything reaches a board.

Validation's probe trains a few steps and exports an inference model exactly as the board does
(``validation_inference.onnx``). :func:`rehearse_judging` evaluates it as the judge will (the
recipe's loss and metrics, a detector's decoding and mAP) on the first few samples of the test set
and of every extra test set, and quantizes it to int8 when the recipe has ``[quantize]``, so a
recipe that passes ``odl prepare`` does not fail after training for a reason the host could see.

It also compares the held-out loss before and after the probe's training (:func:`held_out_change`,
the first ``HELD_OUT`` samples of ``data.test``, the untrained checkpoint exported as the judge's
base model against the probe's model): a rate that diverges on this model (``optimizer.lr = 10``
takes the digits CNN from 3.2 to 275) passes the probe's own checks, whose loss on the repeated
batch can still end below a diverged start, so it becomes a warning (``warnings``), never a failure.
It lives above :mod:`tasks.prepare` (it needs the judge) and reaches the pipeline as its
``rehearse`` hook, which runs in the folder being prepared, before it is renamed into place.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import PipelineError, ValidationFailed, ort_message
from tasks.judge.evaluate import evaluate, judged_as
from tasks.judge.losses import HostLoss, host_loss
from tasks.judge.quantize import quantize_int8
from tasks.prepare import Prepared
from tasks.prepare.sandbox.child_call import call_in_child
from tasks.recipe.datafiles import load_arrays
from tasks.recipe.schema import Recipe
from tasks.stages.judge import inference_of, int8_loss

log = logging.getLogger(__name__)
SAMPLES = 16  # per test set: enough to run every code path, small enough for seconds
INT8_CALIBRATION = 16
# The rate diverges when the held-out loss after the probe's training is far worse than before it:
# above FAR_WORSE x the loss before, AND more than noise: under an unchanged model each held-out
# sample is as likely to get better as worse, so significantly more samples must get worse than
# better (one-sided sign test, p < SIGN_P on HELD_OUT samples). A sign test, not a t-test: a diverged
# model's per-sample losses are heavy-tailed (on digits at lr 10 one sample's loss is ~1.6e4, and
# the paired standard error is as large as the mean rise), while 52 of 64 samples got worse.
HELD_OUT = 64
FAR_WORSE = 2.0
SIGN_P = 0.05


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
    ``host_evaluation`` / ``int8_quantization`` naming the set or the step. It runs in a child
    process (:func:`tasks.prepare.sandbox.child_call.call_in_child`): ONNX Runtime dying there (SIGFPE,
    SIGSEGV, the OOM killer) is the ``host_evaluation`` check's one line, not the end of ``odl``."""
    report = call_in_child(
        "tasks.stages.rehearse:rehearsal", recipe, prep,
        what="the judging rehearsal (the probe's model evaluated on the test sets as the judge will"
        + (", then quantized to int8)" if recipe.quantize else ")"),
        error=lambda line: ValidationFailed("host_evaluation", line),
    )  # fmt: skip
    for line in report["warnings"]:
        log.warning("%s", line)
    log.info("judging rehearsed on %d samples of %s", SAMPLES, ", ".join(["test", *recipe.data.extra_tests]))
    return report


def rehearsal(recipe: Recipe, prep: Prepared) -> dict[str, Any]:
    """:func:`rehearse_judging`'s work, in the process that calls it."""
    model = prep.out_dir / "validation_inference.onnx"
    loss = host_loss(recipe, prep)
    detector = judged_as(recipe, prep.priors)
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
        report["held_out"] = held_out_change(recipe, prep, loss, Path(tmp))
    report["warnings"] = [report["held_out"]["warning"]] if "warning" in report["held_out"] else []
    return report


def held_out_change(recipe: Recipe, prep: Prepared, loss: HostLoss, tmp: Path) -> dict[str, Any]:
    """The recipe's loss on the first ``HELD_OUT`` test samples before and after the probe's
    training, how many samples got worse and better, the sign test's p-value, and ``warning`` when
    the rate diverges (see ``FAR_WORSE``)."""
    head = _head(Path(recipe.data.test), tmp / "held_out.npz", HELD_OUT)
    try:
        base = inference_of(prep, prep.checkpoint, tmp / "base_inference.onnx")
        table = {"keypoints": recipe.keypoints} if recipe.task == "keypoints" else {}  # its labels' meaning
        before = evaluate(base, head, recipe.task, loss=loss, **table)
        after = evaluate(prep.out_dir / "validation_inference.onnx", head, recipe.task, loss=loss, **table)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the named check
        raise _failed("host_evaluation", f"evaluating on data.test ({recipe.data.test})", exc) from exc
    b, a = (np.asarray(m["per_sample"]["loss"], np.float64) for m in (before, after))
    worse, better = int((a > b).sum()), int((a < b).sum())
    figures: dict[str, Any] = {
        "samples": len(b),
        "loss_kind": before["loss_kind"],
        "loss_before": before["loss"],
        "loss_after": after["loss"],
        "samples_worse": worse,
        "samples_better": better,
        "sign_test_p": sign_test(worse, better),
    }
    if figures["loss_after"] > FAR_WORSE * figures["loss_before"] and figures["sign_test_p"] < SIGN_P:
        figures["warning"] = diverging_rate(recipe, figures, _probe_steps(prep))
    return figures


def sign_test(worse: int, better: int) -> float:
    """One-sided p-value of ``worse`` samples out of ``worse + better`` changed ones, were each
    change as likely either way (the exact binomial tail)."""
    changed = worse + better
    return sum(math.comb(changed, k) for k in range(worse, changed + 1)) / 2**changed if changed else 1.0


def _probe_steps(prep: Prepared) -> int:
    """How many training steps the validation probe took (its repeated batch and its batches)."""
    v = prep.validation or {}
    return len(v.get("repeat_losses", [])) + len(v.get("losses", []))


def diverging_rate(recipe: Recipe, figures: dict[str, Any], steps: int) -> str:
    """The one-line warning for a held-out loss the probe's training made far worse."""
    lr, sched = recipe.optimizer.lr, recipe.schedule
    schedule = (
        f"; the board's [schedule] reaches that rate too (schedule.warmup_steps = {sched.warmup_steps}, then "
        f"linear decay to schedule.final_lr_ratio = {sched.final_lr_ratio:g} x lr)"
    )
    warmup = " or warm up over more schedule.warmup_steps" if sched.warmup_steps == 0 else ""
    return (
        f"optimizer.lr = {lr:g} diverges on this model: the validation probe's {steps} training steps at "
        f"that rate took the held-out loss ({figures['loss_kind']}) "
        f"on {figures['samples']} samples of data.test from {figures['loss_before']:.4g} to "
        f"{figures['loss_after']:.4g} ({figures['samples_worse']} samples worse, {figures['samples_better']} "
        f"better){schedule}; lower optimizer.lr (try {lr / 10:g}){warmup}"
    )
