"""Datasets of a recipe: the host files it names, ``.npz`` loading, and checks that they fit the model
(generating missing ones with ``[data].make`` is :mod:`tasks.prepare.datasets`).

An ``.npz`` dataset holds ``x`` (``[N, *input_shape]`` of ``model.input_dtype``: float32 unless the
model takes, say, int64 token ids) and ``y`` (labels: int64 class ids
for classification, float32 for binary/regression, int64 masks ``[N, H, W]`` for segmentation, float32
keypoints ``[N, K, 3]`` (x, y, visibility) for keypoints); extra arrays (e.g. a second target) are allowed
and reach the model through ``[data].feeds``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from tasks.errors import DataError
from tasks.recipe.schema import Recipe
from tasks.recipe.segmentation import segmentation_of


def recipe_files(recipe: Recipe) -> dict[str, Path]:
    """Host files the recipe names, by field name: data sets, local model weights, detection priors,
    an ONNX model, quantize calibration, the held-out folder and the teacher's model (``[data].make``
    runs when any is missing)."""
    d = recipe.data
    files = {
        "data.test": d.test,
        "data.train": d.train,
        "data.eval": d.eval,
        "model.weights": recipe.model.weights,
        "detection.priors": recipe.detection.priors if recipe.detection else None,
        "model.onnx": Path(recipe.model.ref) if recipe.model.kind == "onnx" else None,
        "quantize.calibration": recipe.quantize.calibration if recipe.quantize else None,
        "data.heldout": d.heldout,  # a folder of held-out shard parts
        "teacher.model": recipe.teacher.model if recipe.teacher else None,
    }
    files.update({f"data.extra_tests.{k}": v for k, v in d.extra_tests.items()})
    return {k: v for k, v in files.items() if v is not None}


def data_files(recipe: Recipe) -> dict[str, Path]:
    """The recipe's data sets by field name (``data.train``, ``data.eval``, ``data.test``,
    ``data.extra_tests.<name>``), the ones it names."""
    d = recipe.data
    files = {"data.train": d.train, "data.eval": d.eval, "data.test": d.test}
    files.update({f"data.extra_tests.{k}": v for k, v in d.extra_tests.items()})
    return {k: Path(v) for k, v in files.items() if v is not None}


def check_data_files(recipe: Recipe) -> None:
    """Check every data set of the recipe before anything is exported: sample shape, dtypes, NaN
    and, when the recipe gives ``num_classes``, the label range; DataError naming the field."""
    for field, path in data_files(recipe).items():
        try:
            x, y = load_npz(path)
            check_dataset(recipe, x, y)
        except DataError as exc:
            raise DataError(f"{field} ({path}): {exc}") from exc


def load_npz(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """Load ``x`` and ``y`` from an ``.npz`` file; DataError on a missing file, key or length mismatch."""
    arrays = load_arrays(path)
    for key in ("x", "y"):
        if key not in arrays:
            raise DataError(f"{path}: no array '{key}' (found {sorted(arrays)}); expected 'x' and 'y'")
    x, y = arrays["x"], arrays["y"]
    if x.ndim < 2 or len(x) != len(y) or len(x) == 0:
        raise DataError(
            f"{path}: expected x [N, ...] and y [N, ...] with the same N > 0, got {x.shape} / {y.shape}"
        )
    return x, y


def load_arrays(path: Path | str) -> dict[str, np.ndarray]:
    """Load every array of an ``.npz`` file into memory (no pickles)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc})") from exc


def check_dataset(recipe: Recipe, x: np.ndarray, y: np.ndarray, *, num_classes: int | None = None) -> None:
    """Check that ``x``/``y`` fit the recipe's model: sample shape, dtypes, label range, NaN."""
    want = tuple(recipe.model.input_shape)
    if tuple(x.shape[1:]) != want:
        raise DataError(f"x has sample shape {tuple(x.shape[1:])} but model.input_shape is {list(want)}")
    want_dtype = np.dtype(recipe.model.input_dtype)
    if x.dtype != want_dtype:
        raise DataError(f"x has dtype {x.dtype}, expected {want_dtype} (model.input_dtype)")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise DataError(f"x contains {int((~np.isfinite(x)).sum())} NaN or infinite values")
    if len(y) != len(x):
        raise DataError(f"x has {len(x)} samples but y has {len(y)}")
    if recipe.task == "segmentation":
        check_masks(x, y, num_classes or recipe.model.num_classes, segmentation_of(recipe).ignore_index)
    if recipe.task == "keypoints" and recipe.keypoints is not None:
        check_keypoints(y, recipe.keypoints.count)
    _check_labels(recipe.task, y, num_classes or recipe.model.num_classes)


def check_masks(x: np.ndarray, y: np.ndarray, num_classes: int | None, ignore_index: int) -> None:
    """Segmentation labels: int64 ``[N, H, W]`` (x's spatial size), each pixel a class or ``ignore_index``."""
    if y.dtype != np.int64:
        raise DataError(f"y has dtype {y.dtype}, expected int64 masks [N, H, W] for task 'segmentation'")
    if y.shape[1:] != x.shape[2:]:
        raise DataError(
            f"y has shape {list(y.shape)}, expected masks [N, {', '.join(map(str, x.shape[2:]))}] "
            f"(one class per pixel of x {list(x.shape)})"
        )
    bad = ((y < 0) | (y >= (num_classes or np.iinfo(np.int64).max))) & (y != ignore_index)
    if bad.any():
        top = num_classes - 1 if num_classes else "num_classes - 1"
        raise DataError(
            f"y has mask labels {np.unique(y[bad])[:5].tolist()}, expected classes in [0, {top}] or "
            f"segmentation.ignore_index ({ignore_index}) (sample {int(np.argwhere(bad)[0][0])})"
        )


def check_keypoints(y: np.ndarray, count: int) -> None:
    """Keypoint labels: float32 ``[N, K, 3]`` (x, y, visibility 0/1/2 per keypoint, COCO's), finite."""
    if y.dtype != np.float32:
        raise DataError(
            f"y has dtype {y.dtype}, expected float32 keypoints [N, {count}, 3] for task 'keypoints'"
        )
    if y.ndim != 3 or y.shape[1:] != (count, 3):
        raise DataError(
            f"y has shape {list(y.shape)}, expected keypoints [N, {count}, 3] (x, y, visibility of each "
            f"of keypoints.count = {count})"
        )
    if not np.isfinite(y).all():
        raise DataError("y contains NaN or infinite keypoint coordinates")
    bad = ~np.isin(y[..., 2], (0.0, 1.0, 2.0))
    if bad.any():
        raise DataError(
            f"y has keypoint visibilities {np.unique(y[..., 2][bad])[:5].tolist()}, expected 0 (not "
            f"labelled), 1 (hidden) or 2 (visible) (sample {int(np.argwhere(bad)[0][0])})"
        )


def _check_labels(task: str, y: np.ndarray, num_classes: int | None) -> None:
    if task == "classification":
        if y.dtype != np.int64:
            raise DataError(f"y has dtype {y.dtype}, expected int64 class ids for task 'classification'")
        if num_classes is not None and (y.min() < 0 or y.max() >= num_classes):
            raise DataError(
                f"y has labels in [{y.min()}, {y.max()}], expected [0, {num_classes - 1}] "
                f"(num_classes = {num_classes})"
            )
    elif task in ("binary", "regression"):
        if y.dtype != np.float32:
            raise DataError(f"y has dtype {y.dtype}, expected float32 targets for task '{task}'")
        if not np.isfinite(y).all():
            raise DataError("y contains NaN or infinite values")
        if task == "binary" and not np.isin(y, (0.0, 1.0)).all():
            raise DataError("y has values other than 0 and 1 for task 'binary'")
