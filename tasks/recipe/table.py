"""Typed reading of one TOML table of a recipe: every getter names the field and what was
expected in a :class:`~tasks.errors.RecipeError`; unknown keys are errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tasks.errors import RecipeError

REF_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class Table:
    """One TOML table being read: typed getters that name the field on error."""

    def __init__(self, data: object, where: str, allowed: set[str], source: str) -> None:
        if not isinstance(data, dict):
            raise RecipeError(where, "a table", data, source=source)
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise RecipeError(
                _dot(where, unknown[0]),
                f"a known key, this one is unknown (allowed: {', '.join(sorted(allowed))})",
                source=source,
            )
        self.d, self.where, self.source = data, where, source

    def err(self, key: str, expected: str, got: object = None) -> RecipeError:
        """Build the RecipeError for ``key`` of this table."""
        return RecipeError(_dot(self.where, key), expected, got, source=self.source)

    def get(self, key: str, typ: type | tuple[type, ...], default: Any = ..., what: str = "") -> Any:
        """Return ``key`` checked against ``typ`` (bool is never an int here)."""
        if key not in self.d:
            if default is ...:
                raise self.err(key, f"{what or _tname(typ)} (missing)")
            return default
        val = self.d[key]
        types = typ if isinstance(typ, tuple) else (typ,)
        if (isinstance(val, bool) and bool not in types) or not isinstance(val, typ):
            raise self.err(key, what or _tname(typ), val)
        return val

    def number(
        self, key: str, default: float, lo: float, hi: float = float("inf"), *, integer: bool = False
    ) -> Any:
        """Return a number in [lo, hi] (an int when ``integer``)."""
        typ: Any = int if integer else (int, float)
        kind = "an integer" if integer else "a number"
        val = self.get(key, typ, default, f"{kind} in [{lo}, {hi}]")
        if not lo <= val <= hi:
            raise self.err(key, f"{kind} in [{lo}, {hi}]", val)
        return val if integer else float(val)

    def strings(self, key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Return a list of non-empty strings as a tuple."""
        val = self.get(key, list, list(default), "a list of strings")
        if not all(isinstance(v, str) and v for v in val):
            raise self.err(key, "a list of non-empty strings", val)
        return tuple(val)

    def path(self, key: str, base: Path, *, required: bool = False) -> Path | None:
        """Return an absolute path (relative ones resolve against ``base``)."""
        val = self.get(key, str, ... if required else None, "a file path")
        return None if val is None else (base / val).resolve()


def _dot(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _tname(typ: type | tuple[type, ...]) -> str:
    names = {"str": "a string", "int": "an integer", "float": "a number", "list": "a list", "dict": "a table"}
    types = typ if isinstance(typ, tuple) else (typ,)
    return " or ".join(names.get(t.__name__, t.__name__) for t in types)


def ref(t: Table, key: str, value: str) -> str:
    if not REF_RE.match(value):
        raise t.err(key, "a 'module:callable' reference", value)
    return value


def optional_ref(t: Table, key: str) -> str | None:
    value = t.get(key, str, None, "a 'module:callable' reference")
    return None if value is None else ref(t, key, value)
