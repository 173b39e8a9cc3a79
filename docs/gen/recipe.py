"""Every recipe key, read from the recipe schema (``tasks.recipe.load.json_schema``: the pydantic models of
``tasks/recipe/``, the same text as ``recipes/recipe.schema.json``): its type, bounds, default and help."""

from __future__ import annotations

import json
from typing import Any

from docs.gen.markdown import cell, code, table
from tasks.recipe.load import json_schema

BOUNDS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "length >= {}",
    "minItems": "items >= {}",
    "pattern": "matches `{}`",
}


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return "table"
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"array of {_type(prop.get('items', {}), defs)}"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"table of {_type(prop['additionalProperties'], defs)}"
    return str(kind)


def _bounds(prop: dict[str, Any]) -> str:
    parts: list[str] = []
    for p in [prop, *prop.get("anyOf", []), prop.get("items", {})]:
        if "enum" in p:
            parts.append("one of " + ", ".join(code(json.dumps(v)) for v in p["enum"]))
        for key, form in BOUNDS.items():
            if key in p:
                value = p[key]
                parts.append(form.format(value) if key != "pattern" else "matches " + code(value))
    return "; ".join(dict.fromkeys(parts)) or ""


def _default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in prop:
        return ""
    return code(json.dumps(prop["default"]))


def _rows(prefix: str, schema: dict[str, Any], defs: dict[str, Any]) -> tuple[list[list[str]], list]:
    """The rows of one table, and the sub-tables it holds (key, definition)."""
    rows, subs = [], []
    required = set(schema.get("required", []))
    for key, prop in schema.get("properties", {}).items():
        name = f"{prefix}{key}"
        ref = prop.get("$ref") or next((p["$ref"] for p in prop.get("anyOf", []) if "$ref" in p), None)
        if ref:
            subs.append((name, defs[ref.split("/")[-1]]))
            continue
        rows.append(
            [
                code(name),
                cell(_type(prop, defs)),
                _bounds(prop),
                _default(prop, key in required),
                cell(prop.get("description", "")),
            ]
        )
    return rows, subs


def recipe_page() -> str:
    """The page: the top-level keys, then one section per table, in the schema's order."""
    schema = json_schema()
    defs = schema.get("definitions", {})
    header = ["key", "type", "bounds", "default", "help"]
    top, todo = _rows("", schema, defs)
    out = [
        "# Recipe keys",
        "",
        "Every key a recipe TOML may hold, read from the schema (`tasks/recipe/`). "
        "`odl recipe schema --out recipes/recipe.schema.json` writes the same schema as JSON Schema, "
        "which editors (VS Code's Even Better TOML) use to complete and check a recipe whose first "
        "line is `#:schema ./recipe.schema.json`. Override any key on the command line with "
        "`--set table.key=VALUE` (a TOML value). An unknown key is refused by name.",
        "",
        "## Top level",
        "",
        table(header, top),
    ]
    while todo:
        name, definition = todo.pop(0)
        rows, subs = _rows(f"{name}.", definition, defs)
        todo = subs + todo
        doc = cell(definition.get("description", "")).replace("``", "`")
        out += ["", f"## `[{name}]`", "", doc, "", table(header, rows)]
    return "\n".join(out)
