"""One-line :class:`~tasks.errors.RecipeError` messages from pydantic's validation errors.

The schema (:mod:`tasks.recipe.schema`) says each field's type, bounds and help once; this module
turns the first error pydantic reports into the project's one line: the field in the recipe's dotted
form (``training.epochs``), what was expected (read off the field's type and bounds, or its
:class:`Expect` text) and what was given. An unknown key gets the closest known one ("did you mean
epochs?"). A schema validator that checks several fields together raises :func:`expected`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from tasks.errors import RecipeError

CHECK = "recipe"  # the error type of the schema's own checks (PydanticCustomError)
UNKNOWN_KEY = ("unexpected_keyword_argument", "extra_forbidden")
MISSING = ("missing", "missing_argument")
NOUNS = {"integer": "integers", "number": "numbers", "string": "strings", "file path": "file paths"}


@dataclasses.dataclass(frozen=True)
class Expect:
    """Field metadata: what an error on this field says was expected, where the type says it badly
    (a pattern, a path rule)."""

    text: str


def expected(text: str, field: str = "", got: object = None) -> PydanticCustomError:
    """The error a schema validator raises: ``text`` is what was expected of ``field`` (relative to
    the table the validator belongs to; "" for the table itself), ``got`` what it holds."""
    return PydanticCustomError(CHECK, "{expected}", {"expected": text, "field": field, "got": got})


def recipe_error(exc: ValidationError, root: type, where: str = "", source: str = "") -> RecipeError:
    """The RecipeError for the first error of ``exc``, raised validating ``root`` (a schema table);
    ``where`` is ``root``'s dotted place in the recipe ("" for the recipe itself)."""
    err = exc.errors(include_url=False)[0]
    path, info, owner, rest = _locate(root, err["loc"])
    ctx: dict[str, Any] = err.get("ctx") or {}
    if err["type"] == CHECK:
        field = _dot(_dot(where, ".".join(path)), ctx.get("field", ""))
        return RecipeError(field, ctx["expected"], ctx.get("got"), source=source)
    field = _dot(where, ".".join(path))
    if err["type"] in UNKNOWN_KEY and owner is not None:
        return unknown_key(owner, path[-1], field, source)
    what = describe(info.annotation, info.metadata) if info is not None else "a valid value"
    if err["type"] in MISSING:
        return RecipeError(field, f"{what} (missing)", source=source)
    if rest:  # an item of a list or a value of a table
        part = f"item {rest[0]}" if isinstance(rest[0], int) else repr(rest[0])
        return RecipeError(field, f"{what} ({part} is {err['input']!r})", source=source)
    return RecipeError(field, what, err["input"], source=source)


def unknown_key(owner: type, key: str, field: str, source: str = "") -> RecipeError:
    """The error for an unknown ``key`` of table ``owner``: the closest known key, and all of them."""
    return RecipeError(
        field, f"a known key, this one is unknown ({close_match(key, known_keys(owner))})", source=source
    )


def close_match(key: str, allowed: list[str]) -> str:
    """ "did you mean <closest>? allowed: a, b, c" for an unknown ``key`` (recipe keys, flow parameters)."""
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{hint}allowed: {', '.join(sorted(allowed))}"


def known_keys(table: type) -> list[str]:
    """The keys a recipe file may give table ``table`` (its fields but the ones kept out of the file)."""
    fields: dict[str, FieldInfo] = table.__pydantic_fields__  # type: ignore[attr-defined]
    return [name for name, info in fields.items() if not _hidden(info)]


def describe(annotation: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> str:
    """What a value of this type and these constraints is, in words: "an integer in [1, 100000]",
    "'adamw' or 'sgd'", "a non-empty list of strings"."""
    tp, meta = _unwrap(annotation, list(metadata))
    for m in meta:
        if isinstance(m, Expect):
            return m.text
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in args)
    if tp is bool:
        return "true or false"
    if tp in (int, float):
        return ("an integer" if tp is int else "a number") + _bounds(meta)
    if tp is str:
        return "a non-empty string" if _min_length(meta) else "a string"
    if isinstance(tp, type) and issubclass(tp, Path):
        return "a file path"
    if origin in (tuple, list):
        items = _plural(describe(args[0]))
        return f"{'a non-empty list' if _min_length(meta) else 'a list'} of {items}"
    if origin is dict:
        return "a table" if args[1] is Any else f"a table of name = {describe(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return "a valid value"


def _locate(root: type, loc: tuple[int | str, ...]) -> tuple[list[str], FieldInfo | None, type | None, tuple]:
    """Walk ``loc`` down the schema's tables: the field path, the last field's info, the table that
    holds it, and what is left of ``loc`` below the field (a list index, a table key)."""
    table: type | None = root
    path: list[str] = []
    info: FieldInfo | None = None
    owner: type | None = None
    for i, part in enumerate(loc):
        fields = getattr(table, "__pydantic_fields__", None)
        if fields is None or not isinstance(part, str):
            return path, info, owner, tuple(loc[i:])
        owner = table
        path.append(part)
        if part not in fields:
            return path, None, owner, ()
        info = fields[part]
        table = _table_type(info.annotation)
    return path, info, owner, ()


def _table_type(annotation: Any) -> type | None:
    tp, _ = _unwrap(annotation, [])
    return tp if isinstance(tp, type) and hasattr(tp, "__pydantic_fields__") else None


def _unwrap(tp: Any, meta: list[Any]) -> tuple[Any, list[Any]]:
    """Strip ``Annotated`` (collecting its metadata, a Field's constraints too) and ``| None``."""
    while True:
        if get_origin(tp) is Annotated:
            base, *extra = get_args(tp)
            for m in extra:
                meta.extend(m.metadata if isinstance(m, FieldInfo) else [m])
            tp = base
        elif get_origin(tp) in (Union, types.UnionType):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp, meta
            tp = members[0]
        else:
            return tp, meta


def _bounds(meta: list[Any]) -> str:
    lo = next(((m.ge, "[") for m in meta if isinstance(m, at.Ge)), None) or next(
        ((m.gt, "(") for m in meta if isinstance(m, at.Gt)), None
    )
    hi = next(((m.le, "]") for m in meta if isinstance(m, at.Le)), None) or next(
        ((m.lt, ")") for m in meta if isinstance(m, at.Lt)), None
    )
    if lo and hi:
        return f" in {lo[1]}{_num(lo[0])}, {_num(hi[0])}{hi[1]}"
    if lo:
        return f" {'>=' if lo[1] == '[' else '>'} {_num(lo[0])}"
    if hi:
        return f" {'<=' if hi[1] == ']' else '<'} {_num(hi[0])}"
    return ""


def _num(value: Any) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _min_length(meta: list[Any]) -> bool:
    return any(isinstance(m, at.MinLen) and m.min_length > 0 for m in meta)


def _plural(text: str) -> str:
    """ "a non-empty string" -> "non-empty strings"."""
    text = text.removeprefix("a ").removeprefix("an ")
    for noun, nouns in NOUNS.items():
        if noun in text:
            return text.replace(noun, nouns, 1)
    return text


def _hidden(info: FieldInfo) -> bool:
    return any(isinstance(m, SkipJsonSchema) for m in info.metadata)


def _dot(where: str, key: str) -> str:
    return f"{where}.{key}" if where and key else where or key
