"""Building blocks of the recipe schema: the table decorator and the value types its fields share.

:func:`recipe_table` makes a class a frozen pydantic dataclass that refuses unknown keys; building
one (``TrainingSpec(epochs=0)``, ``dataclasses.replace(recipe.training, epochs=0)``) validates it and
raises the one-line :class:`~tasks.errors.RecipeError` naming the field (``training.epochs``).
Numbers and booleans are strict, as TOML is typed: ``true`` is no integer, ``2.5`` and ``"3"`` are no
epochs. Relative paths resolve against the recipe's folder, given as the validation context
``{"base": folder}`` by the loader (objects built in code keep their paths as given).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar, dataclass_transform

from pydantic import AfterValidator, ConfigDict, Field, Strict, ValidationError, ValidationInfo
from pydantic.dataclasses import dataclass as pydantic_dataclass

from device_agent.protocol import BOARD_PATH_ALLOWED, board_path_ok
from tasks.recipe.messages import Expect, expected, recipe_error

T = TypeVar("T")

CONFIG = ConfigDict(extra="forbid")
REF_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
BOARD_PATH = BOARD_PATH_ALLOWED  # the agent's own rule (device_agent.names), so both refuse the same


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, Field))
def recipe_table(where: str) -> Callable[[type[T]], type[T]]:
    """Make a class the schema of the recipe's table ``where`` ("" for the recipe itself): a frozen
    pydantic dataclass, unknown keys refused, every construction validated into a RecipeError."""

    def make(cls: type[T]) -> type[T]:
        table: Any = pydantic_dataclass(frozen=True, config=CONFIG)(cls)
        validate = table.__init__

        @functools.wraps(validate)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                validate(self, *args, **kwargs)
            except ValidationError as exc:
                raise recipe_error(exc, table, where) from None

        table.__init__ = __init__
        return table

    return make


def _resolve(path: Path, info: ValidationInfo) -> Path:
    """A relative path against the recipe's folder (the loader's context), absolute afterwards."""
    base = (info.context or {}).get("base")
    return (Path(base) / path).resolve() if base is not None else path


def _board_path(path: str) -> str:
    if not board_path_ok(path):
        raise expected(BOARD_PATH, got=path)
    return path


Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Text = Annotated[str, Field(min_length=1)]
Texts = tuple[Text, ...]
Ref = Annotated[str, Field(pattern=REF_PATTERN), Expect("a 'module:callable' reference")]
FilePath = Annotated[Path, AfterValidator(_resolve)]
BoardPath = Annotated[str, AfterValidator(_board_path), Expect(BOARD_PATH)]


def present(data: Any, keys: tuple[str, ...]) -> list[str]:
    """The ``keys`` a table gives in the file (a before-validator sees the TOML table as a dict)."""
    return [k for k in keys if isinstance(data, dict) and k in data]
