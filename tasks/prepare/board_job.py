"""Build the board's ``job.json`` (protocol.JobSpec) from a recipe and its prepared artifacts.

Artifacts and host-side data files become content-addressed blobs: the spec names them by
sha256, and the returned mapping says which local file to upload for each hash.
"""

from __future__ import annotations

import threading
from pathlib import Path

from device_agent.protocol import (
    RUNTIME_ARTIFACTS,
    BlobRef,
    DataRef,
    JobSpec,
    KeypointsScoring,
    PrefixSpec,
    SpecError,
    TeacherSpec,
    TrainParams,
    file_sha256,
    valid_job_id,
)
from tasks.checkpoint import checkpoint_weights, write_checkpoint
from tasks.errors import ArtifactError, DataError, RecipeError
from tasks.prepare import Prepared
from tasks.prepare.validation.teacher import wire_teacher
from tasks.recipe.schema import Recipe
from tasks.recipe.segmentation import segmentation_of

__all__ = ["build_job_spec", "file_sha256", "train_params"]


def train_params(recipe: Recipe, *, max_steps: int = 0) -> TrainParams:
    """The recipe's optimizer, schedule and training tables as protocol.TrainParams."""
    params = TrainParams(
        batch_size=recipe.training.batch_size,
        epochs=recipe.training.epochs,
        lr=float(recipe.optimizer.lr),
        warmup_steps=recipe.schedule.warmup_steps,
        final_lr_ratio=float(recipe.schedule.final_lr_ratio),
        checkpoint_every=recipe.training.checkpoint_every,
        log_every=recipe.training.log_every,
        seed=recipe.training.seed,
        max_steps=max_steps,
    )
    try:
        params.check("training")
    except SpecError as exc:
        raise RecipeError(exc.field, exc.expected, source=str(recipe.source)) from exc
    return params


def build_job_spec(
    recipe: Recipe,
    prepared: Prepared,
    job_id: str,
    *,
    max_steps: int = 0,
    checkpoint: Path | None = None,
    train_data: DataRef | None = None,
) -> tuple[JobSpec, dict[str, Path]]:
    """The JobSpec for ``job_id`` and the local files to upload, keyed by sha256.

    Artifacts come from ``prepared.manifest["files"]`` (hashes computed at generation time);
    the memory estimate from ``prepared.validation["board_peak_estimate_mb"]`` when present.
    """
    try:
        valid_job_id(job_id)
    except SpecError as exc:
        raise RecipeError("job_id", exc.expected, job_id) from exc
    files: dict[str, Path] = {}
    split = prepared.manifest.get("prefix_cache") or {}
    entries = split.get("files") if split.get("enabled") else None
    runtime = prepared.manifest.get("runtime", "ort-training")
    keys = RUNTIME_ARTIFACTS[runtime]
    artifacts = {key: _artifact_blob(prepared, key, files, entries) for key in keys}
    prefix = _prefix(recipe, prepared, split, files) if entries is not None else None
    if checkpoint is not None and entries is not None:  # the full graph's weights, for the suffix's graphs
        checkpoint = suffix_checkpoint(checkpoint, prepared.out_dir / entries["checkpoint"]["path"])
    if checkpoint is not None:  # a warm start: the same graphs, other starting weights
        sha = file_sha256(checkpoint)
        files[sha] = Path(checkpoint)
        artifacts["checkpoint"] = BlobRef(sha, Path(checkpoint).stat().st_size)
    if train_data is None and recipe.data.board_dataset is not None:
        raise RecipeError(
            "data.board_dataset",
            "the files to train on, listed on the board first (tasks.stages.board_data)",
            source=str(recipe.source),
        )
    train = train_data or _data_ref(recipe.data.train, recipe.data.board_train, "data.train", files)
    eval_ref = _data_ref(recipe.data.eval, None, "data.eval", files) if recipe.data.eval else None
    manifest = prepared.manifest
    spec = JobSpec(
        job_id=job_id,
        artifacts=artifacts,
        train_data=train,
        eval_data=eval_ref,
        train=train_params(recipe, max_steps=max_steps),
        task=recipe.task,
        output_names=tuple(manifest.get("inference_output_names") or _output_names(recipe)),
        feeds=dict(manifest.get("feeds") or recipe.data.feeds),
        memory_estimate_mb=_memory_estimate(prepared.validation or {}),
        recipe_name=recipe.name,
        num_classes=(recipe.model.num_classes or 0)
        if recipe.task in ("classification", "segmentation")
        else 0,
        ignore_index=segmentation_of(recipe).ignore_index if recipe.task == "segmentation" else None,
        keypoints=_keypoints(recipe),
        prefix=prefix,
        teacher=_teacher(recipe, prepared, files),
        runtime=runtime,
    )
    return spec, files


def _keypoints(recipe: Recipe) -> KeypointsScoring | None:
    """A keypoints job's scoring: the recipe's PCK threshold and heatmap decoding."""
    spec = recipe.keypoints
    if recipe.task != "keypoints" or spec is None:
        return None
    return KeypointsScoring(float(spec.pck_threshold), bool(spec.subpixel))


def _memory_estimate(validation: dict) -> float:
    """Validation's board peak estimate, plus what a teacher adds (its session's memory is not all
    given back before training starts: measured 528 MB peak for 486 + 106 MB estimated)."""
    teacher = (validation.get("checks") or {}).get("teacher") or {}
    return float(validation.get("board_peak_estimate_mb", 0.0)) + float(teacher.get("teacher_mb", 0.0))


def _teacher(recipe: Recipe, prepared: Prepared, files: dict[str, Path]) -> TeacherSpec | None:
    """The job's ``teacher``: the recipe's teacher model as a blob, and its labelling rule (a
    detector teacher's boxes are matched to the student's priors, a blob too)."""
    if recipe.teacher is None:
        return None
    path = recipe.teacher.model
    if not path.is_file():
        raise RecipeError("teacher.model", "an ONNX file on the host", str(path), source=str(recipe.source))
    blobs = {}
    for key, p in (
        ("model", path),
        ("priors", prepared.priors if recipe.teacher.labels == "boxes" else None),
    ):
        if p is not None:
            if not Path(p).is_file():
                raise ArtifactError(f"teacher.{key}: {p} is missing; run prepare again")
            sha = file_sha256(p)
            files[sha] = Path(p)
            blobs[key] = BlobRef(sha, Path(p).stat().st_size)
    classes = recipe.model.num_classes or 0
    return wire_teacher(recipe, blobs["model"].sha256, blobs["model"].size, classes, blobs.get("priors"))


def _prefix(recipe: Recipe, prepared: Prepared, split: dict, files: dict[str, Path]) -> PrefixSpec:
    """The job's ``prefix``: the forward-only model before the cut, and how to keep its outputs."""
    model = _artifact_blob(prepared, "prefix_model", files, split["files"])
    return PrefixSpec(
        model,
        tuple(split["prefix_inputs"]),
        split["cut"],
        dtype=recipe.training.cache_dtype,
        store=recipe.training.cache_store,
    )


_SUFFIXES: dict[tuple, Path] = {}  # (full, its size and mtime, suffix base) -> the checkpoint made of it
_SUFFIX_LOCK = threading.Lock()


def suffix_checkpoint(full: Path, suffix_base: Path) -> Path:
    """``full``'s weights (a warm start's or a fleet round's checkpoint of the whole graph) in a
    checkpoint of the suffix's graphs, written beside it: once per content of ``full`` in a process
    (a fleet round's boards share one checkpoint; its thousand jobs make its suffix once, and one at a
    time: numpy reads an ``.npz`` header with ``ast``, whose conversions CPython 3.11 does not make
    thread-safe, gh-106905: "AST constructor recursion depth mismatch" in a board's part)."""
    st = Path(full).stat()
    key = (str(Path(full).resolve()), st.st_size, st.st_mtime_ns, str(suffix_base))
    with _SUFFIX_LOCK:
        made = _SUFFIXES.get(key)
        if made is None or not made.is_file():
            made = _SUFFIXES[key] = _suffix_checkpoint(full, suffix_base)
        return made


def _suffix_checkpoint(full: Path, suffix_base: Path) -> Path:
    weights = checkpoint_weights(full)
    wanted = checkpoint_weights(suffix_base)
    missing = sorted(set(wanted) - set(weights))
    if missing:
        raise ArtifactError(f"{full}: has no parameter {missing[0]!r} that the split artifacts train")
    out = Path(full).with_name(Path(full).name + ".suffix")
    return write_checkpoint(suffix_base, {n: weights[n] for n in wanted}, out, every=True)


def _output_names(recipe: Recipe) -> list[str]:
    names = list(recipe.model.output_names)
    return names[1:] if recipe.loss.kind == "embedded" else names


def _artifact_blob(
    prepared: Prepared, key: str, files: dict[str, Path], entries: dict | None = None
) -> BlobRef:
    entry = (entries if entries is not None else prepared.manifest.get("files", {})).get(key)
    if not entry:
        where = "prefix_cache.files" if entries is not None else "files"
        raise ArtifactError(f"{prepared.manifest_path}: no {where}.{key} entry; run prepare again")
    path = prepared.out_dir / entry["path"]
    if not path.is_file() or path.stat().st_size != entry["size"]:
        raise ArtifactError(f"artifact {key}: {path} is missing or its size differs from the manifest")
    files[entry["sha256"]] = path
    return BlobRef(entry["sha256"], int(entry["size"]))


def _data_ref(host: Path | None, board: str | None, field: str, files: dict[str, Path]) -> DataRef:
    if host is None:
        if not board:
            raise RecipeError(field, "a host file or a board path")
        fmt = "npz" if board.endswith(".npz") else "image-folder"
        return DataRef(fmt, path=board)
    if not Path(host).is_file() or Path(host).suffix != ".npz":
        raise DataError(f"{field}: {host} is not an .npz file on the host")
    sha = file_sha256(host)
    files[sha] = Path(host)
    return DataRef("npz", blob=BlobRef(sha, Path(host).stat().st_size))
