"""Read recipe TOML files into :class:`tasks.recipe.schema.Recipe`: overrides, validation, hashing.

Validation is the schema's (pydantic); its first error becomes a one-line
:class:`tasks.errors.RecipeError` naming the field and what was expected
(:mod:`tasks.recipe.messages`). :func:`json_schema` is the schema for editors (``odl recipe schema``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from tasks.errors import RecipeError
from tasks.recipe.fields import NAME_PATTERN
from tasks.recipe.host_runtime import check_runtime
from tasks.recipe.messages import recipe_error, unknown_key
from tasks.recipe.schema import Recipe

NAME_RE = re.compile(NAME_PATTERN)
LOADER_KEYS = ("source", "raw")  # the Recipe's fields the loader sets, never keys of the file
RECIPE: TypeAdapter[Recipe] = TypeAdapter(Recipe)
JSON_SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"


def parse_recipe(data: dict, source: Path) -> Recipe:
    """Validate a parsed TOML mapping and build the typed :class:`Recipe`."""
    src = str(source)
    for key in LOADER_KEYS:
        if key in data:
            raise unknown_key(Recipe, key, key, src)
    fields = {**data, "source": Path(source).resolve(), "raw": copy.deepcopy(data)}
    try:
        return RECIPE.validate_python(fields, context={"base": Path(source).resolve().parent})
    except ValidationError as exc:
        raise recipe_error(exc, Recipe, source=src) from None


def apply_overrides(data: dict, overrides: dict[str, object]) -> dict:
    """Return a copy of ``data`` with dotted keys (``training.epochs``) set to new values."""
    out = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RecipeError(dotted, f"'{part}' to be a table", node)
        node[leaf] = value
    return out


def load_recipe(path: Path | str, overrides: dict[str, object] | None = None) -> Recipe:
    """Read a recipe TOML file, apply dotted-key overrides, validate and return it; a runtime this
    host's Python cannot build (``ort-training`` on Python >= 3.12) is refused here, before anything runs."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise RecipeError("recipe", "an existing recipe file", str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError("recipe", f"valid TOML ({exc})", source=str(path)) from exc
    recipe = parse_recipe(apply_overrides(data, overrides or {}), path)
    check_runtime(recipe, str(path))
    return recipe


def recipe_hash(recipe: Recipe) -> str:
    """sha256 of the canonical JSON of the raw recipe (stable across key order)."""
    canon = json.dumps(recipe.raw, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()


def parse_override(text: str) -> tuple[str, object]:
    """Parse a CLI ``key=value`` override; the value is read as TOML (falls back to a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise RecipeError("--set", "key=value", text)
    try:
        parsed: object = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed


class TomlJsonSchema(GenerateJsonSchema):
    """The JSON Schema of a TOML file: TOML has no null, so an optional key is just its type, with
    no ``"default": null``; properties carry their help, not a title."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        out = super().default_schema(schema)
        if out.get("default", ...) is None:
            out.pop("default")
        return out

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def json_schema() -> dict[str, Any]:
    """The recipe's JSON Schema, for editors that check TOML files: draft 7 (``definitions``), the
    draft Taplo (VS Code's Even Better TOML) and SchemaStore's TOML schemas use."""
    schema = RECIPE.json_schema(
        mode="validation", schema_generator=TomlJsonSchema, ref_template="#/definitions/{model}"
    )
    definitions = schema.pop("$defs")
    return {"$schema": JSON_SCHEMA_DIALECT, **schema, "definitions": definitions}


def json_schema_text() -> str:
    """:func:`json_schema` as the text of ``recipes/recipe.schema.json`` (fields in schema order)."""
    return json.dumps(json_schema(), indent=2) + "\n"
