"""The data checks of validation: every host data set against the exported model, as the board
checks it after the upload (sample shape, dtypes, NaN, labels in the model's class range, the arrays
the training inputs need), so nothing the board would refuse is uploaded.

Two passes, each raising DataError (exit 55) with one line naming the field and file: the host's
own check of ``x``/``y`` (:func:`tasks.recipe.datafiles.check_dataset`, with the model's class count
when the recipe gives none), then, for the sets that go to the board (``data.train``,
``data.eval``), the agent's own check (:func:`device_agent.data.checks.check_dataset`) of every array the
training inputs are fed from, against the inputs of the eval graph the board loads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.helper import tensor_dtype_to_np_dtype

from device_agent.data.checks import check_dataset as board_check
from device_agent.data.readers import InputSpec, NpzDataset
from device_agent.errors import AgentError
from tasks.errors import DataError
from tasks.prepare import graph_file
from tasks.prepare.feeds import feed_keys
from tasks.recipe.datafiles import check_dataset, data_files, load_arrays, load_npz
from tasks.recipe.schema import Recipe
from tasks.recipe.segmentation import segmentation_of

BOARD_SETS = ("data.train", "data.eval")  # uploaded with the job and checked by the agent there


def model_classes(out_dir: Path, manifest: dict, task: str = "classification") -> int | None:
    """The class count of a classifier (or a segmentation model) as the board reads it when the
    recipe gives no ``num_classes``: from the first inference output of the exported graph."""
    name = (manifest.get("inference_output_names") or [None])[0]
    return graph_classes(Path(out_dir) / "model.onnx", task, name)


def graph_classes(model_path: Path, task: str, output: str | None = None) -> int | None:
    """The class count an exported model's output ``output`` (its first, without a name) holds: the
    last dimension of a classifier's ``[N, C]``, the channel dimension of a segmentation model's
    ``[N, C, H, W]``; None when the graph does not give it (a symbolic or absent dimension)."""
    graph = onnx.load(str(model_path), load_external_data=False).graph
    out = next((o for o in graph.output if output is None or o.name == output), None)
    dims = out.type.tensor_type.shape.dim if out is not None else []
    if task == "segmentation":
        return dims[1].dim_value or None if len(dims) == 4 else None
    return dims[-1].dim_value or None if len(dims) >= 2 else None


def check_data_against_model(recipe: Recipe, model_path: Path) -> None:
    """The data checks that need only the exported model, run before any training step is built
    or run, under every runtime: each data set's sample shape, dtypes, NaN and infinities, labels
    in the class range the graph gives (when the recipe has no ``num_classes``) and token ids within
    their embedding's rows. DataError (exit 55) naming the field and file: a step run on such data
    would fail inside ONNX Runtime or PyTorch and blame the model."""
    outputs = [o.name for o in onnx.load(str(model_path), load_external_data=False).graph.output]
    inference = outputs[1:] if recipe.loss.kind == "embedded" else outputs
    classes = _classes(recipe, lambda: graph_classes(model_path, recipe.task, next(iter(inference), None)))
    _host_checks(recipe, classes, embedding_tables(model_path))


def _classes(recipe: Recipe, from_graph: Callable[[], int | None]) -> int | None:
    """The recipe's ``num_classes``, else the graph's for a task whose labels are classes."""
    if recipe.model.num_classes is None and recipe.task in ("classification", "segmentation"):
        return from_graph()
    return recipe.model.num_classes


def _host_checks(recipe: Recipe, classes: int | None, tables: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """The host's own check of every data set (``x``/``y`` and token ids); a summary per field."""
    summary = {}
    for field, path in data_files(recipe).items():
        try:
            x, y = load_npz(path)
            check_dataset(recipe, x, y, num_classes=classes)
            check_token_ids(
                tables, feed_keys(recipe, recipe.model.input_names), load_arrays(path) if tables else {}
            )
        except DataError as exc:
            raise DataError(f"{field} ({path}): {exc}") from exc
        summary[field] = {"samples": len(x), "x_shape": list(x.shape[1:])}
    return summary


def board_inputs(out_dir: Path, manifest: dict) -> list[InputSpec]:
    """The inputs the board's data must fill, as the agent reads them from the eval graph: the
    training inputs of ``manifest["feeds"]`` in the graph's order (the data input before the labels,
    whatever their names: the manifest's keys are sorted) with their shapes (None for a symbolic
    dimension) and numpy dtypes."""
    rel = graph_file(manifest, "eval")
    graph = onnx.load(str(Path(out_dir) / rel), load_external_data=False).graph
    by_name = {i.name: i.type.tensor_type for i in graph.input}
    specs = []
    for name in [i.name for i in graph.input if i.name in manifest["feeds"]]:  # the board's order
        tensor = by_name[name]
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim]
        specs.append(InputSpec.of(name, dims, np.dtype(tensor_dtype_to_np_dtype(tensor.elem_type))))
    return specs


def check_board_data(recipe: Recipe, field: str, path: Path, manifest: dict, inputs: list[InputSpec],
                     classes: int | None) -> None:  # fmt: skip
    """The agent's own check of a data set it will train or evaluate on: an array for every
    training input (through ``manifest["feeds"]``), each with the input's rank, per-sample shape
    and dtype kind, no NaN/inf, labels in the class range; DataError naming ``field`` and ``path``."""
    try:
        data = NpzDataset(path, [i.name for i in inputs], manifest["feeds"], field)
        ignore = segmentation_of(recipe).ignore_index if recipe.task == "segmentation" else None
        board_check(data, inputs, recipe.task, classes, field, ignore)
    except AgentError as exc:
        raise DataError(f"{field} ({path}): {str(exc).removeprefix(f'{field}: ')}") from exc


def check_data(recipe: Recipe, manifest: dict, out_dir: Path | None = None) -> dict[str, Any]:
    """Check every host data file against the model (what the board would refuse after the upload:
    sample shape, dtypes, NaN, labels in the model's class range, the arrays the feeds need);
    DataError naming the field and file, else a summary per field. Without ``out_dir`` (no
    exported model to read) only the recipe's ``num_classes`` bounds the labels and the board's
    own check is skipped."""
    classes = _classes(recipe, lambda: model_classes(out_dir, manifest, recipe.task) if out_dir else None)
    inputs = board_inputs(out_dir, manifest) if out_dir is not None else None
    tables = embedding_tables(Path(out_dir) / "model.onnx") if out_dir is not None else {}
    summary = _host_checks(recipe, classes, tables)
    for field, path in data_files(recipe).items():
        if inputs is not None and field in BOARD_SETS:
            check_board_data(recipe, field, path, manifest, inputs, classes)
        elif field in BOARD_SETS:
            _check_feeds_present(field, path, manifest["feeds"])
    return {field.removeprefix("data."): figures for field, figures in summary.items()}


def embedding_tables(model_path: Path) -> dict[str, tuple[str, int]]:
    """Model inputs that index an embedding directly (``Gather(table, input)`` on axis 0 of an
    initializer, as ``nn.Embedding`` exports): input name -> (table, its rows)."""
    graph = onnx.load(str(model_path), load_external_data=False).graph
    dims = {i.name: list(i.dims) for i in graph.initializer}
    inputs = {i.name for i in graph.input} - set(dims)
    out: dict[str, tuple[str, int]] = {}
    for node in graph.node:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if node.op_type == "Gather" and node.input[1] in inputs and dims.get(node.input[0]) and axis == 0:
            out.setdefault(node.input[1], (node.input[0], dims[node.input[0]][0]))
    return out


def check_token_ids(tables: dict[str, tuple[str, int]], keys: dict[str, str], arrays: dict[str, Any]) -> None:
    """DataError when the ids fed to an embedding fall outside its rows (ONNX Runtime's Gather would
    stop on the board, PyTorch's embedding on the host)."""
    for name, (table, rows) in tables.items():
        ids = arrays.get(keys.get(name, name))
        if ids is None or ids.dtype.kind not in "iu" or not len(ids):
            continue
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= rows:
            raise DataError(
                f"{keys.get(name, name)} holds token ids in [{lo}, {hi}] for input {name!r}, but the embedding "
                f"{table!r} it indexes has {rows} rows (ids 0 to {rows - 1})"
            )


def _check_feeds_present(field: str, path: Path, feeds: dict[str, str]) -> None:
    """Without the eval graph: at least an array for every training input."""
    missing = sorted(set(feeds.values()) - set(load_arrays(path)))
    if missing:
        raise DataError(f"{field} ({path}): no arrays {missing} needed by the training inputs {feeds}")
