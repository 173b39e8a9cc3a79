"""Exceptions raised inside the user's own model code, named as such.

A model built or run from a ``module:callable`` in the recipe folder can fail in the user's code
(a loss casting labels to int32, an arithmetic slip in ``__init__``). Blaming a recipe field for
that sends the user to the wrong place: the error names the innermost traceback frame inside the
recipe folder (file:line and function) and the exception's own first line. A forward that fails
(:func:`forward_error`) blames ``model.input_shape`` only when its message is about a shape: a
dtype slip in the user's loss is the user's line, not the recipe's input shape.
"""

from __future__ import annotations

import re
import sys
import sysconfig
import traceback
from pathlib import Path

from tasks.errors import ModelError, PipelineError, RecipeError
from tasks.paths import PROJECT_ROOT

SHAPE_WORDS = re.compile(
    r"\bshapes?\b|\bsizes?\b|dimension|\bdims?\b|channels|\bview\b|reshape|\b\d+D\b|mat1 and mat2", re.I
)
LIBRARIES = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, *sysconfig.get_paths().values())}
PIPELINE = [PROJECT_ROOT / d for d in ("tasks", "flows", "device_agent")]
TORCH = Path(sysconfig.get_paths()["purelib"]).resolve() / "torch"


def _inside(filename: str, folders: list[Path] | set[Path]) -> bool:
    try:
        path = Path(filename).resolve()
    except (OSError, ValueError):
        return False
    return any(path.is_relative_to(f) for f in folders)


def user_frame(exc: BaseException, base_dir: Path) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc``'s traceback in a file of the recipe folder ``base_dir``; else
    the innermost one in code that is neither an installed library nor this pipeline (a user's
    package the model module imports); None when the exception comes from libraries alone."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    own = [f for f in frames if _inside(f.filename, [Path(base_dir).resolve()])]
    elsewhere = [
        f for f in frames if not _inside(f.filename, LIBRARIES) and not _inside(f.filename, PIPELINE)
    ]
    return (own or elsewhere or [None])[-1]


def user_code_error(
    exc: BaseException,
    base_dir: Path,
    doing: str,
    *,
    who: str = "the model's code",
    error: type[PipelineError] = ModelError,
) -> PipelineError | None:
    """``<who> raised <Type> at <file>:<line> (in <function>) <doing>: <first line>`` as ``error``
    (the stage's class: ModelError for the model's code, DataError for ``[data].make``) when the
    exception comes from the user's code (:func:`user_frame`); None otherwise. A branch on a
    tensor's value that a trace cannot follow is said as such wherever it is (:func:`value_branch`)."""
    branch = value_branch(exc, doing)
    if branch is not None:
        return error(branch)
    frame = user_frame(exc, base_dir)
    if frame is None:
        return None
    path, base = Path(frame.filename).resolve(), Path(base_dir).resolve()
    rel = path.relative_to(base) if path.is_relative_to(base) else path
    first = (str(exc).strip().splitlines() or [""])[0]
    return error(
        f"{who} raised {type(exc).__name__} at {rel}:{frame.lineno} (in {frame.name}) {doing}: {first}"
    )


def value_branch(exc: BaseException, doing: str) -> str | None:
    """The line for a trace stopped by Python code deciding on a tensor's value (torch's
    ``GuardOnDataDependentSymNode``: ``if torch.rand([]) < p``, Hugging Face's LayerDrop), naming
    the innermost frame outside torch (the model's code, or the library it comes from) and its source
    line; None for any other exception."""
    if type(exc).__name__ != "GuardOnDataDependentSymNode":
        return None
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    outside = [f for f in frames if not _inside(f.filename, [TORCH]) and not _inside(f.filename, PIPELINE)]
    where = ""
    if outside:
        frame = outside[-1]
        name = frame.filename.rpartition("site-packages/")[2]
        where = f" at {name}:{frame.lineno} (in {frame.name}" + (f": `{frame.line}`)" if frame.line else ")")
    return (
        f"the model's code decides on a tensor's value{where} {doing}, which a train step of fixed operators "
        "cannot hold: if that value is a random draw (a layer dropped at random, as a config's layerdrop), set "
        "its probability to 0; else make only layers after it trainable, or use training.runtime = 'ort-training'"
    )


def about_shape(message: str) -> bool:
    """Whether an error message is plausibly about a tensor's shape (size, dimensions, channels)."""
    return bool(SHAPE_WORDS.search(message))


def forward_error(exc: BaseException, base_dir: Path, fed: str, input_shape: list[int]) -> PipelineError:
    """The error for a model whose forward raised ``exc`` on ``fed`` (``2 samples of data.train``):
    the user's frame and the cause when it is the user's code, ``model.input_shape`` named only when
    the message is about a shape, else ModelError with the cause."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    shaped = about_shape(first)
    doing = f"on {fed}" + (f" of shape {input_shape} (model.input_shape)" if shaped else "")
    named = user_code_error(exc, base_dir, doing)
    if named is not None:
        return named
    if shaped:
        return RecipeError("model.input_shape", "a shape the model accepts", f"{input_shape}: {first}")
    return ModelError(f"the model's forward raised {type(exc).__name__} {doing}: {first}")
