"""Torch-free training probe run by :mod:`tasks.prepare.validation.validate` in a subprocess (``python -m tasks.prepare.validation.ort_probe``).

It loads the artifacts like the board does (numpy + onnxruntime's training API, torch blocked),
first repeats one batch from the base weights to see the loss fall (ORT seeded, so dropout masks
are the same run to run), then trains a few timed steps at the recipe's batch size, exports the
inference model, runs an eval step, runs the eval step's forward over every batch the board will
train on (:func:`board_batches`), and prints one JSON line with the losses, the time per step
and the process's peak RSS. It imports only the standard library, numpy and onnxruntime.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("torch", None)  # type: ignore[arg-type]  # like a board: torch cannot load

import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from device_agent.data.readers import epoch_permutation, steps_per_epoch  # noqa: E402
from device_agent.job.batch_mark import BatchMarker  # noqa: E402
from device_agent.ort import load_onnxruntime, load_training_api, seed_runtime, session_options  # noqa: E402
from device_agent.runtimes import open_runtime  # noqa: E402

STAGE = ["load_artifacts"]  # the check a failure belongs to, reported to the parent


def _enter(stage: str) -> None:
    """Record the check now running, and say it on stderr: a probe killed by a signal leaves no
    report, and its parent reads the last stage from there."""
    STAGE[0] = stage
    print(f"odl-probe-stage {stage}", file=sys.stderr, flush=True)


def _loss(out: object) -> float:
    first = out[0] if isinstance(out, (list, tuple)) else out
    return float(np.asarray(first, dtype=np.float64).reshape(-1)[0])


def _rows(start: int) -> None:
    """Say on stderr the first row of the batch about to run: a probe killed by a signal leaves no
    report, and its parent runs that batch again to find the node that dies."""
    print(f"odl-probe-rows {start}", file=sys.stderr, flush=True)


def _batches(arrays: list[np.ndarray], batch: int, count: int):
    n = len(arrays[0])
    for i in range(count):
        start = (i * batch) % n
        idx = np.arange(start, start + batch) % n
        _rows(start)
        yield [a[idx] for a in arrays]


def peak_rss_mb() -> float:
    """Peak RSS of this process in MB: VmHWM (reset by exec, unlike ru_maxrss, which keeps the
    forking parent's peak on Linux), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def probe(cfg: dict) -> dict:
    """Run the probe described by ``cfg`` (see tasks.validate.run_probe) and return its report."""
    _enter("load_artifacts")
    if cfg.get("runtime", "ort-training") != "ort-training":  # the board's own runtime code
        api, module, optimizer = _runtime(cfg)
    else:
        api = load_training_api()
        seed_runtime(cfg.get("seed", 0))  # before the sessions exist: they draw their dropout seeds
        art = Path(cfg["artifacts_dir"])
        state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
        module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
        optimizer = api.Optimizer(str(art / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(cfg["lr"])
    with np.load(cfg["data"], allow_pickle=False) as npz:
        arrays = [npz[cfg["feeds"][name]] for name in module.input_names()]
    report: dict = {"input_names": list(module.input_names()), "n_samples": len(arrays[0])}
    _enter("train_step")
    module.train()
    # the repeated batch starts from the base weights, before any other batch has been seen
    first = next(_batches(arrays, cfg["batch_size"], 1))
    repeat = []
    for _ in range(cfg["repeat"]):
        repeat.append(_loss(module(*first)))
        optimizer.step()
        module.lazy_reset_grad()
    losses, times = [], []
    for feed in _batches(arrays, cfg["batch_size"], cfg["steps"]):
        t0 = time.perf_counter()
        losses.append(_loss(module(*feed)))
        optimizer.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - t0)
    # export before the eval step: the peak up to here is what a job without an eval set reaches
    # (training + the final export); the eval graph's session adds its own arena on top
    _enter("export_inference")
    module.export_model_for_inferencing(cfg["inference_path"], cfg["inference_outputs"])
    report["train_peak_rss_mb"] = peak_rss_mb()
    _enter("eval_step")
    _rows(0)  # the eval step and the split check run the first batch again
    module.eval()
    report["eval_loss"] = _loss(module(*first))
    report.update(
        losses=losses,
        repeat_losses=repeat,
        first_step_s=times[0],
        time_per_step_s=statistics.median(times[1:] or times),
        peak_rss_mb=peak_rss_mb(),
        torch_loaded=sys.modules.get("torch") is not None,
    )
    if cfg.get("board_batches"):  # after the peaks are read: the weights trained above are the board's kind
        _enter("board_batches")
        report["board_batches"] = board_batches(module, arrays, cfg)
    if cfg.get("split"):  # after the peaks are read: its sessions are not the job's
        _enter("split_matches_full")
        report["split_check"] = split_check(api, cfg, dict(zip(module.input_names(), first, strict=True)))
    return report


def board_batches(module: Any, arrays: list[np.ndarray], cfg: dict) -> dict[str, Any]:
    """The eval step's forward (the loss included) over every batch the board will train on, in its
    order: each epoch's shuffle of the training rows (the agent's ``epoch_permutation`` of the seed
    and epoch) cut at the batch size, the eval set's batches in order (``eval_data``) after the
    first epoch, each marked before it runs (``mark``: :class:`device_agent.job.batch_mark.BatchMarker`) so that a
    signal that kills this process names its batch. A batch whose loss's precondition fails (an
    integer division by a count of positive labels it leaves at 0) dies here, not on the board.
    Stops after ``budget_s`` seconds; returns what it covered."""
    plan, bs, n = cfg["board_batches"], cfg["batch_size"], len(arrays[0])
    spe = steps_per_epoch(n, bs, plan["drop_last"])
    eval_arrays = []
    if plan.get("eval_data"):
        with np.load(plan["eval_data"], allow_pickle=False) as npz:
            eval_arrays = [npz[cfg["feeds"][name]] for name in module.input_names()]
    marker = BatchMarker(Path(plan["mark"]), keep=bs)
    module.eval()
    t0, done = time.perf_counter(), {"train": 0, "eval": 0}
    try:
        for epoch in range(plan["epochs"]):
            perm = epoch_permutation(plan["seed"], epoch, n)
            for k in range(spe):
                if time.perf_counter() - t0 > plan["budget_s"]:
                    return _covered(done, spe * plan["epochs"], t0, plan["budget_s"])
                rows = perm[k * bs : (k + 1) * bs]
                marker.mark("train", epoch * spe + k + 1, epoch + 1, rows)
                module(*[a[rows] for a in arrays])
                done["train"] += 1
            if epoch == 0 and eval_arrays:  # the board evaluates after each epoch: the same batches
                for start in range(0, len(eval_arrays[0]), bs):
                    rows = np.arange(start, min(len(eval_arrays[0]), start + bs))
                    marker.mark("eval", spe, 1, rows)
                    module(*[a[rows] for a in eval_arrays])
                    done["eval"] += 1
    finally:
        marker.close()
    return _covered(done, spe * plan["epochs"], t0)


def _covered(done: dict[str, int], total: int, t0: float, budget: float | None = None) -> dict[str, Any]:
    out = {"train_batches": done["train"], "of": total, "eval_batches": done["eval"],
           "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip
    return out | ({"stopped_at_budget_s": budget} if budget is not None else {})


def _runtime(cfg: dict) -> tuple[Any, Any, Any]:
    """(api, module, optimizer) of another runtime than ORT's, opened as the agent opens a job's,
    its random draws seeded by the recipe's seed."""
    paths = {key: Path(path) for key, path in cfg["files"].items()}
    opened = open_runtime(cfg["runtime"], paths, paths["checkpoint"])
    if opened.seeder is not None:
        opened.seeder(cfg.get("seed", 0))
    return opened.api, opened.module, opened.optimizer


def split_check(api: Any, cfg: dict, feeds: dict[str, np.ndarray]) -> dict[str, float]:
    """The eval loss of one batch from the base weights: by the full eval graph, and by the split
    prefix (an inference session) followed by the suffix's eval graph, as a caching job computes it.
    Both modules also export their base-weights inference models (``split.inference_paths``): the
    host joins the suffix's to the prefix as retrieval will and compares it with the full one."""

    def module_of(training: str, checkpoint: str, eval_model: str) -> Any:
        module = api.Module(training, api.CheckpointState.load_checkpoint(checkpoint), eval_model)
        module.eval()
        return module

    def eval_loss(module: Any, given: dict[str, np.ndarray]) -> float:
        return _loss(module(*[given[n] for n in module.input_names()]))

    art, split = Path(cfg["artifacts_dir"]), cfg["split"]
    files = split["files"]
    runtime = cfg.get("runtime", "ort-training")
    if runtime != "ort-training":  # the board's runtime over the full and the split files
        full_module, suffix_module = (_runtime(cfg | {"files": f})[1].eval() for f in (cfg["files"], files))
    else:
        full_module = module_of(
            str(art / "training_model.onnx"), str(art / "checkpoint"), str(art / "eval_model.onnx")
        )
        suffix_module = module_of(files["training_model"], files["checkpoint"], files["eval_model"])
    full = eval_loss(full_module, feeds)
    ort = load_onnxruntime()
    prefix = ort.InferenceSession(
        files["prefix_model"], session_options(ort), providers=["CPUExecutionProvider"]
    )
    (cut,) = prefix.run([split["cut"]], {n: feeds[n] for n in split["prefix_inputs"]})
    part = eval_loss(suffix_module, {**feeds, split["cut"]: cut})
    paths = split.get("inference_paths")
    if paths and runtime == "ort-training":  # the autograd runtime writes the whole model either way
        full_module.export_model_for_inferencing(paths["full"], cfg["inference_outputs"])
        suffix_module.export_model_for_inferencing(paths["suffix"], cfg["inference_outputs"])
    return {"full_eval_loss": full, "split_eval_loss": part}


def main() -> int:
    """Read the JSON config from argv[1], print the JSON report (or the error) on stdout."""
    cfg = json.loads(sys.argv[1])
    try:
        print(json.dumps({"ok": True, "report": probe(cfg)}))
    except Exception as exc:  # noqa: BLE001 - the parent turns it into a named failed check
        print(json.dumps({"ok": False, "stage": STAGE[0], "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
