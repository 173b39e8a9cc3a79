"""Exceptions raised inside the user's own model code, named as such.

A model built or run from a ``module:callable`` in the recipe folder can fail in the user's code
(a loss casting labels to int32, an arithmetic slip in ``__init__``). Blaming a recipe field for
that sends the user to the wrong place: the error names the innermost traceback frame inside the
recipe folder (file:line and function) and the exception's own first line.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from tasks.errors import ModelError


def user_frame(exc: BaseException, base_dir: Path) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc``'s traceback whose file lies in ``base_dir`` (None if none)."""
    base = Path(base_dir).resolve()
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            inside = Path(frame.filename).resolve().is_relative_to(base)
        except (OSError, ValueError):
            inside = False
        if inside:
            found = frame
    return found


def user_code_error(exc: BaseException, base_dir: Path, doing: str) -> ModelError | None:
    """``the model's code raised <Type> at <file>:<line> (in <function>) <doing>: <first line>``
    when the exception comes from a file of the recipe folder; None otherwise."""
    frame = user_frame(exc, base_dir)
    if frame is None:
        return None
    rel = Path(frame.filename).resolve().relative_to(Path(base_dir).resolve())
    first = (str(exc).strip().splitlines() or [""])[0]
    return ModelError(
        f"the model's code raised {type(exc).__name__} at {rel}:{frame.lineno} (in {frame.name}) {doing}: {first}"
    )
