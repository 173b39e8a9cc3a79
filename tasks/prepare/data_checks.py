"""The data checks of validation: every host data set against the exported model, as the board
checks it after the upload (sample shape, dtypes, NaN, labels in the model's class range, the arrays
the training inputs need), so nothing the board would refuse is uploaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from tasks.errors import DataError
from tasks.recipe.datafiles import check_dataset, data_files, load_arrays, load_npz
from tasks.recipe.schema import Recipe


def model_classes(out_dir: Path, manifest: dict) -> int | None:
    """The class count of a classifier: the last dimension of its (first inference) output in the
    exported graph, as the board reads it when the recipe gives no ``num_classes``."""
    name = (manifest.get("inference_output_names") or [None])[0]
    graph = onnx.load(str(Path(out_dir) / "model.onnx"), load_external_data=False).graph
    out = next((o for o in graph.output if o.name == name), None)
    dims = out.type.tensor_type.shape.dim if out is not None else []
    return dims[-1].dim_value or None if len(dims) >= 2 else None


def check_data(recipe: Recipe, manifest: dict, out_dir: Path | None = None) -> dict[str, Any]:
    """Check every host data file against the model (what the board would refuse after the upload:
    sample shape, dtypes, NaN, labels in the model's class range, the arrays the feeds need);
    DataError naming the field and file, else a summary per field."""
    classes = recipe.model.num_classes
    if classes is None and recipe.task == "classification" and out_dir is not None:
        classes = model_classes(out_dir, manifest)
    summary = {}
    for field, path in data_files(recipe).items():
        try:
            x, y = load_npz(path)
            check_dataset(recipe, x, y, num_classes=classes)
            missing = sorted(set(manifest["feeds"].values()) - set(load_arrays(path)))
            if missing and field == "data.train":
                raise DataError(f"no arrays {missing} needed by the training inputs {manifest['feeds']}")
        except DataError as exc:
            raise DataError(f"{field} ({path}): {exc}") from exc
        summary[field.removeprefix("data.")] = {"samples": len(x), "x_shape": list(x.shape[1:])}
    return summary
