"""What preparation feeds the graphs and models it runs: the recipe's own data, zeros only without any.

A graph run on made-up inputs can do what no real batch does: all-zero labels select no positive
box, and a loss dividing by that count kills ONNX Runtime with SIGFPE. So every run of
preparation (the exporter's trace, tensor shapes, the batch check, the validation comparisons)
takes its inputs from here: a few samples of ``data.train`` (``data.test`` when there is no train
file), each graph input fed by its name through ``[data].feeds`` (``x`` and ``y`` by position
otherwise), cast to the dtype the graph declares. An input the data has no array for, or none of
the declared shape, gets zeros (and the description says so).

Graph helpers called deep inside the fix-ups do not know the recipe: :func:`representative` puts
its data in a context variable for a block, and :func:`graph_feeds` reads it from there.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tasks.errors import ModelError, RecipeError
from tasks.recipe.datafiles import load_arrays
from tasks.recipe.schema import Recipe

EXAMPLE_BATCH = 2
SAMPLE_ROWS = 8  # samples kept in memory for graph feeds (shape probes run at batch 2 and 3)
POSITIONAL_KEYS = ("x", "y")


def feed_keys(recipe: Recipe, input_names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Map graph input names to npz keys: ``[data].feeds`` first, then ``x``, ``y`` by position."""
    defaults = dict(zip(input_names, POSITIONAL_KEYS, strict=False))
    return {name: recipe.data.feeds.get(name, defaults.get(name, name)) for name in input_names}


def data_file(recipe: Recipe) -> tuple[str, Path]:
    """The recipe's data file preparation takes samples from and its field: ``data.train`` when
    that file exists, else ``data.test``."""
    if recipe.data.train is not None and Path(recipe.data.train).exists():
        return "data.train", Path(recipe.data.train)
    return "data.test", Path(recipe.data.test)


def example_arrays(recipe: Recipe, input_names: tuple[str, ...], n: int = EXAMPLE_BATCH) -> list[np.ndarray]:
    """The first ``n`` samples of the recipe's data for each input (made-up x of ``model.input_dtype``
    if no data file exists)."""
    _, path = data_file(recipe)
    if not path.exists():
        if len(input_names) > 1:
            raise ModelError(f"a model with inputs {list(input_names)} needs its data file {path} to export")
        return [_made_up(recipe, n)]
    arrays = load_arrays(path)
    out = []
    for name, key in feed_keys(recipe, input_names).items():
        if key not in arrays:
            raise RecipeError(f"data.feeds.{name}", f"an array of {path.name} (has {sorted(arrays)})", key)
        out.append(arrays[key][:n])
    if tuple(out[0].shape[1:]) != tuple(recipe.model.input_shape):
        raise RecipeError(
            "model.input_shape",
            f"the shape of one sample of '{input_names[0]}' in {path.name}, {list(out[0].shape[1:])}",
            list(recipe.model.input_shape),
        )
    return out


def _made_up(recipe: Recipe, n: int) -> np.ndarray:
    """``n`` samples of ``model.input_shape`` without a data file: standard normal floats, or zeros
    of an integer ``model.input_dtype`` (id 0 is a valid token id of any embedding)."""
    dtype = np.dtype(recipe.model.input_dtype)
    shape = (n, *recipe.model.input_shape)
    if dtype.kind == "f":
        return np.random.default_rng(0).standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)


@dataclass(frozen=True)
class DataSample:
    """A few samples of a data file: ``arrays`` by npz key, ``keys`` (graph input -> npz key, the
    recipe's ``[data].feeds``; ``x``, ``y`` by position for the others), ``source`` (its field)."""

    arrays: dict[str, np.ndarray]
    source: str
    keys: dict[str, str] = field(default_factory=dict)

    def array_for(self, name: str, position: int) -> np.ndarray | None:
        """The samples fed to graph input ``name`` (the ``position``-th input), or None."""
        default = POSITIONAL_KEYS[position] if position < len(POSITIONAL_KEYS) else name
        return self.arrays.get(self.keys.get(name, default))


def recipe_sample(recipe: Recipe, rows: int = SAMPLE_ROWS) -> DataSample | None:
    """The first ``rows`` samples of every array of the recipe's data file (None without one)."""
    source, path = data_file(recipe)
    if not path.is_file():
        return None
    arrays = {k: np.ascontiguousarray(v[:rows]) for k, v in load_arrays(path).items() if v.ndim >= 1}
    return DataSample(arrays, source, dict(recipe.data.feeds))


class _Lazy:
    """A recipe's sample, read from its file on first use."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe, self.loaded, self.sample = recipe, False, None

    def get(self) -> DataSample | None:
        if not self.loaded:
            self.sample, self.loaded = recipe_sample(self.recipe), True
        return self.sample


_CURRENT: contextvars.ContextVar[_Lazy | None] = contextvars.ContextVar("odl_prepare_sample", default=None)


@contextlib.contextmanager
def representative(recipe: Recipe) -> Iterator[None]:
    """For the block, :func:`graph_feeds` takes its inputs from ``recipe``'s data (read once, when a
    graph first runs)."""
    token = _CURRENT.set(_Lazy(recipe))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_sample() -> DataSample | None:
    """The data of the innermost :func:`representative` block (None outside one or without data)."""
    lazy = _CURRENT.get()
    return lazy.get() if lazy is not None else None


@dataclass(frozen=True)
class Feeds:
    """A graph's feeds and where they come from (``origin``, said in messages)."""

    arrays: dict[str, np.ndarray]
    origin: str


def graph_feeds(model: onnx.ModelProto, batch: int, sample: DataSample | None = None) -> Feeds:
    """Feeds for every graph input of ``model`` that is not an initializer: ``batch`` samples of
    ``sample`` (default: :func:`current_sample`), repeated when it has fewer, cast to the declared
    dtype; zeros of the declared shape (unknown dimensions = ``batch``) where it has none that fits."""
    sample = sample if sample is not None else current_sample()
    inits = {i.name for i in model.graph.initializer}
    arrays, zeros = {}, []
    inputs = [v for v in model.graph.input if v.name not in inits]
    for position, value in enumerate(inputs):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        data = sample.array_for(value.name, position) if sample is not None else None
        fitted = _fit(data, dims, batch) if data is not None else None
        if fitted is None:
            zeros.append(value.name)
            fitted = np.zeros([batch if d is None else d for d in dims], dtype)
        arrays[value.name] = fitted.astype(dtype, copy=False)
    return Feeds(arrays, _origin(sample, batch, zeros, len(inputs)))


def _fit(data: np.ndarray, dims: list[int | None], batch: int) -> np.ndarray | None:
    """``data``'s rows repeated to the batch (the declared first dimension when static); None when
    its sample shape disagrees with a static dimension the graph declares."""
    if data.ndim != len(dims) or data.ndim == 0 or len(data) == 0:
        return None
    if any(d is not None and d != got for d, got in zip(dims[1:], data.shape[1:], strict=True)):
        return None
    rows = dims[0] if dims[0] is not None else batch
    return data[np.arange(rows) % len(data)]


def _origin(sample: DataSample | None, batch: int, zeros: list[str], count: int) -> str:
    """How the feeds were made, for messages: ``2 samples of data.train``, ``all-zero inputs (...)``."""
    if sample is None:
        return "all-zero inputs (no data file)"
    if len(zeros) == count:
        return f"all-zero inputs ({sample.source} has no array of their shapes)"
    said = f"{batch} samples of {sample.source}"
    return said + (
        f" (zeros for {', '.join(repr(z) for z in zeros)}: no array of that shape)" if zeros else ""
    )
