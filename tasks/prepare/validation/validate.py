"""Offline validation of a prepared recipe (the ORT on-device-training blog's step 2).

Checks, each a named :class:`ValidationFailed` on failure: the data fit the model; the artifacts
load and train with a finite loss; the loss falls when one batch is repeated; an eval step runs;
the eval step's forward runs on every batch the board will train on, in the board's order (a
batch that kills ONNX Runtime, e.g. an integer division by a count of positive labels it leaves at
0, is named by its step, epoch and samples; ``board_batches``, within ``BATCHES_BUDGET_S``);
the frozen-prefix split (when there is one) gives the full graph's eval loss on one batch;
``export_model_for_inferencing`` works and its output matches the PyTorch model with the same
(trained) weights. The training runs in a torch-free subprocess (:mod:`tasks.prepare.validation.ort_probe`) at the
recipe's batch size, so its peak RSS is what a board would see; ``validation.json`` records it all.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from device_agent.protocol import TrainParams
from tasks.errors import ValidationFailed
from tasks.paths import PROJECT_ROOT
from tasks.prepare import graph_file
from tasks.prepare.sandbox.ort_parent import stop_if_interrupted
from tasks.prepare.sandbox.probe_failures import crash_check, failed_check, where_probe_died
from tasks.prepare.sandbox.supervise import supervised
from tasks.prepare.validation.data_checks import check_data, model_classes
from tasks.prepare.validation.rehearse import check_join, inference_paths
from tasks.prepare.validation.teacher import check_budget, rehearse_teacher
from tasks.prepare.validation.torch_compare import compare_with_torch
from tasks.recipe.load import recipe_hash
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
SPLIT_TOL = 1e-3  # relative: the split and the full eval graph fuse the same float32 ops differently,
# more so with depth (ConvMixer-768/32 at random init: 2.1e-4); a wrong split differs by far more
MEMORY_MARGIN = (1.05, 16.0)  # board estimate = peak * 1.05 + 16 MB (allocator and board-side slack;
# bench/memory.py: the probe's peak is within 3 % of the agent's at batch 1-32 of mobilenet_v2)
PROBE_TIMEOUT_S = 600
REPEAT_STEPS = 12  # steps on one batch for "loss falls"; the first and last AVERAGED are compared
AVERAGED = 3
ZERO_LOSS = 1e-6  # a loss this small cannot fall: the model already fits the batch
BATCHES_BUDGET_S = 30.0  # the board batches check stops after this long (validation.json says how far)


def run_probe(recipe: Recipe, out_dir: Path, manifest: dict, steps: int) -> dict[str, Any]:
    """Train a few steps in a torch-free subprocess; return its report or raise the failed check."""
    cfg = {
        "artifacts_dir": str(out_dir / "artifacts"),
        "data": str(
            out_dir / "teacher_probe.npz" if recipe.teacher else recipe.data.train or recipe.data.test
        ),
        "feeds": manifest["feeds"],
        "batch_size": recipe.training.batch_size,
        "steps": max(steps, 2),
        "repeat": REPEAT_STEPS,
        "seed": recipe.training.seed,
        "lr": recipe.optimizer.lr,
        "inference_path": str(out_dir / "validation_inference.onnx"),
        "inference_outputs": manifest["inference_output_names"],
        "split": _split_cfg(out_dir, manifest),
        "runtime": manifest.get("runtime", "ort-training"),  # the board's runtime, which the probe runs
        "files": {key: str(out_dir / entry["path"]) for key, entry in manifest["files"].items()},
    }
    with tempfile.TemporaryDirectory(prefix="odl-probe-") as tmp:
        cfg["board_batches"] = _batches_plan(recipe, Path(tmp) / "batch")
        proc = _probe_process(cfg)
        lines = proc.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
        if result is None:
            stop_if_interrupted(proc.returncode)
            raise crash_check(proc.returncode, proc.stderr, where_probe_died(out_dir, cfg, manifest, proc))
    if not result["ok"]:
        raise failed_check(result["stage"], result["error"], out_dir / graph_file(manifest, "train"))
    return result["report"]


def _probe_process(cfg: dict[str, Any]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tasks.prepare.validation.ort_probe", json.dumps(cfg)]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise ValidationFailed(
            "train_step", f"the training probe did not finish in {PROBE_TIMEOUT_S} s"
        ) from exc


def _batches_plan(recipe: Recipe, mark: Path) -> dict[str, Any]:
    """What the board batches check runs: the board's epochs of the probe's data, shuffled as the
    agent shuffles them (its seed; the host's jobs keep every last, smaller batch: drop_last off),
    then the eval set's batches; ``mark`` receives each batch's rows."""
    return {
        "epochs": recipe.training.epochs,
        "seed": recipe.training.seed,
        "drop_last": TrainParams.drop_last,
        "eval_data": str(recipe.data.eval) if recipe.data.eval else None,
        "budget_s": BATCHES_BUDGET_S,
        "mark": str(mark),
    }


def _split_cfg(out_dir: Path, manifest: dict) -> dict[str, Any] | None:
    """What the probe needs to run the split artifacts (None when the recipe trains unsplit)."""
    cache = manifest.get("prefix_cache") or {}
    if not cache.get("enabled"):
        return None
    files = {key: str(out_dir / entry["path"]) for key, entry in cache["files"].items()}
    return {
        "cut": cache["cut"],
        "prefix_inputs": cache["prefix_inputs"],
        "files": files,
        "inference_paths": inference_paths(out_dir),
    }


def check_split(probe: dict[str, Any]) -> dict[str, Any] | str:
    """The split artifacts' eval loss of one batch against the full graph's (within ``SPLIT_TOL``
    relative); ValidationFailed when they differ. A note when the recipe trains unsplit."""
    got = probe.get("split_check")
    if got is None:
        return "no frozen-prefix split (see manifest.json prefix_cache)"
    full, part = got["full_eval_loss"], got["split_eval_loss"]
    if not math.isfinite(part) or abs(part - full) > SPLIT_TOL * max(1.0, abs(full)):
        raise ValidationFailed(
            "split_matches_full",
            f"the frozen-prefix split computes an eval loss of {part:.6g} on one batch where the full graph "
            f"computes {full:.6g}; set training.prefix_cache = 'off' to train the full graph on the board",
        )
    return {**got, "tolerance": SPLIT_TOL}


def board_batches_covered(recipe: Recipe, probe: dict[str, Any]) -> dict[str, Any]:
    """What the board batches check ran (every batch ran: a crash raised before), with a note when
    it stopped at its budget or the board trains on other data than the probe's."""
    got = dict(probe["board_batches"])
    notes = []
    if got.get("stopped_at_budget_s") is not None:
        notes.append(f"stopped after {got['stopped_at_budget_s']:.0f} s: {got['train_batches']} of the board's "
                     f"{got['of']} training batches ran, the later ones did not")  # fmt: skip
        log.warning("validation: the board batches check %s", notes[-1])
    if recipe.teacher is not None or recipe.data.train is None:
        notes.append("the board trains on other data (its own files, or the teacher's labels): these were the "
                     "batches of the probe's data in the board's order")  # fmt: skip
    return got | ({"note": "; ".join(notes)} if notes else {})


FROZEN_BN_HINT = (
    "; frozen BatchNorm (the default) needs running statistics that fit the data: pretrained or "
    "calibrated weights (a random init has none), or trainable.batchnorm = 'batch-stats'"
)

FLAT = 1e-3  # relative: a repeated batch's loss within this of its start stayed flat, above it rose


def check_losses(report: dict[str, Any], batchnorm: str | None = None) -> str | None:
    """Finite losses; the repeated batch's loss falls (mean of the last steps below the first).

    Returns a note when the check passes without the loss falling (it was already ~0); raises
    ValidationFailed saying whether the loss diverged, rose or stayed flat, and what to try.
    """
    losses, repeat = report["losses"], report["repeat_losses"]
    if not all(math.isfinite(v) for v in [*losses, *repeat, report["eval_loss"]]):
        raise ValidationFailed(
            "loss_finite",
            f"non-finite loss (train {_short(losses)}, one batch repeated {_short(repeat)}, eval "
            f"{report['eval_loss']:.4g}): the loss diverged; lower optimizer.lr or check the data for NaN/inf"
            + (FROZEN_BN_HINT if batchnorm == "frozen" else ""),
        )
    start, end = statistics.fmean(repeat[:AVERAGED]), statistics.fmean(repeat[-AVERAGED:])
    if start <= ZERO_LOSS:
        return f"the loss on the repeated batch was already ~0 ({start:.3g}): nothing left to learn on it"
    if end < start:
        return None
    if end > 1.5 * start:
        how = f"diverged ({start:.5g} -> {end:.5g}): lower optimizer.lr"
    elif end > start * (1 + FLAT):
        how = f"rose ({start:.5g} -> {end:.5g}): lower optimizer.lr"
    else:
        how = f"stayed flat ({start:.5g} -> {end:.5g}): raise optimizer.lr or train more parameters"
    hint = FROZEN_BN_HINT if batchnorm == "frozen" and end > start else ""
    raise ValidationFailed(
        "loss_falls",
        f"repeating one batch {len(repeat)} times from the base weights, the loss {how} "
        f"(also check that the loss matches the labels){hint}",
    )


def _short(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values[:6]) + (", ...]" if len(values) > 6 else "]")


def validate(recipe: Recipe, out_dir: Path, *, steps: int = 5) -> dict:
    """Run every offline check on ``out_dir`` (from ``generate``); write and return validation.json."""
    out_dir = Path(out_dir).resolve()  # the probe runs in a child of another working folder
    manifest = json.loads((out_dir / "manifest.json").read_text())
    report: dict[str, Any] = {"passed": False, "recipe_hash": recipe_hash(recipe), "checks": {}}
    with supervised("validation", recipe):  # one child for the stage's graph runs
        probe = _checks(recipe, out_dir, manifest, report, steps)
    report.update(_figures(recipe, probe, manifest))
    if recipe.teacher is not None:
        try:
            check_budget(recipe, report["checks"]["teacher"], report["board_peak_estimate_mb"])
        except ValidationFailed as exc:
            _failed(out_dir, report, exc)
    report["passed"] = True
    _write(out_dir, report)
    log.info(
        "validation passed: %.4f s/step at batch %d, board peak estimate %.0f MB",
        report["time_per_step_s"],
        recipe.training.batch_size,
        report["board_peak_estimate_mb"],
    )
    return report


def _checks(
    recipe: Recipe, out_dir: Path, manifest: dict, report: dict[str, Any], steps: int
) -> dict[str, Any]:
    """Every check up to the comparison with PyTorch, recorded in ``report``; the probe's report."""
    try:
        report["checks"]["data_fits_model"] = check_data(recipe, manifest, out_dir)
        if recipe.teacher is not None:  # before the probe, which trains on the teacher's labels
            classes = recipe.model.num_classes or model_classes(out_dir, manifest) or 0
            report["checks"]["teacher"] = rehearse_teacher(recipe, out_dir, classes, MEMORY_MARGIN)
        probe = run_probe(recipe, out_dir, manifest, steps)
        report["checks"].update(load_artifacts=True, train_step=True, eval_step=True, export_inference=True)
        note = check_losses(probe, recipe.trainable.batchnorm)
        report["checks"].update(loss_finite=True, loss_falls=note or True)
        report["checks"]["board_batches"] = board_batches_covered(recipe, probe)
        report["checks"]["split_matches_full"] = check_split(probe)
        report["checks"]["join_matches_full"] = check_join(recipe, out_dir, manifest)
        report["checks"]["inference_matches_torch"] = compare_with_torch(
            recipe, out_dir / "validation_inference.onnx", manifest
        )
    except ValidationFailed as exc:
        _failed(out_dir, report, exc)
    return probe


def _failed(out_dir: Path, report: dict[str, Any], exc: ValidationFailed) -> NoReturn:
    """Record the failed check in validation.json and on the error, and raise it again."""
    report.update(failed_check=exc.check, error=str(exc))
    _write(out_dir, report)
    exc.report = report  # for callers whose folder does not survive the failure
    raise exc


def _figures(recipe: Recipe, probe: dict[str, Any], manifest: dict) -> dict[str, Any]:
    scale, extra = MEMORY_MARGIN
    n = probe["n_samples"]
    # the board runs the eval graph only when the job has an eval set (its session adds an arena)
    peak = probe["peak_rss_mb"] if recipe.data.eval else probe.get("train_peak_rss_mb", probe["peak_rss_mb"])
    return {
        "batch_size": recipe.training.batch_size,
        "steps_per_epoch": math.ceil(n / recipe.training.batch_size),
        "time_per_step_s": probe["time_per_step_s"],
        "first_step_s": probe["first_step_s"],
        "measured_peak_rss_mb": peak,
        "probe_peak_rss_mb_with_eval": probe["peak_rss_mb"],
        "board_peak_estimate_mb": peak * scale + extra,
        "memory_margin": f"measured peak RSS of a torch-free training process x {scale} + {extra} MB "
        f"({'with' if recipe.data.eval else 'without'} the eval graph, as the job)",
        "probe_torch_loaded": probe["torch_loaded"],
        "losses": probe["losses"],
        "repeat_losses": probe["repeat_losses"],
        "eval_loss": probe["eval_loss"],
        "trainable_count": manifest["trainable_count"],
    }


def _write(out_dir: Path, report: dict[str, Any]) -> None:
    (out_dir / "validation.json").write_text(json.dumps(report, indent=2, sort_keys=True))
