"""The Prefect deployments (``deploy/prefect.yaml``) and their parameters (the flows' parameter models)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from docs.gen.markdown import cell, code, table
from tasks.paths import PROJECT_ROOT

PREFECT_YAML = PROJECT_ROOT / "deploy" / "prefect.yaml"


def _params_model(entry: str) -> Any:
    """The parameter model of the flow at ``entry`` (``flows/x.py:func``): its ``params`` annotation."""
    import importlib
    import typing

    path, name = entry.split(":")
    flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
    fn = getattr(flow, "fn", flow)  # a Prefect flow wraps its function
    return typing.get_type_hints(fn)["params"]


def _kind(prop: dict[str, Any]) -> str:
    if "anyOf" in prop:
        return " or ".join(_kind(p) for p in prop["anyOf"] if p.get("type") != "null") + " or null"
    if "enum" in prop:
        return "one of " + ", ".join(code(json.dumps(v)) for v in prop["enum"])
    bounds = [f"{k} {prop[k]}" for k in ("minimum", "exclusiveMinimum", "maximum") if k in prop]
    return cell(" ".join([prop.get("type", "any"), *bounds]))


def _parameters(model: Any) -> str:
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    rows = []
    for name, prop in schema["properties"].items():
        if "$ref" in prop:
            prop = defs[prop["$ref"].split("/")[-1]]
        alts = [defs[p["$ref"].split("/")[-1]] if "$ref" in p else p for p in prop.get("anyOf", [])]
        shown = {**prop, "anyOf": alts} if alts else prop
        default = code(json.dumps(prop["default"])) if "default" in prop else ""
        rows.append([code(name), _kind(shown), default, cell(prop.get("description", ""))])
    return table(["parameter", "type", "default", "help"], rows)


def deployments_page() -> str:
    """One section per deployment: entrypoint, tags, schedule, the defaults it is deployed with, parameters."""
    spec = yaml.safe_load(PREFECT_YAML.read_text())
    out = [
        "# Deployments",
        "",
        "`odl stack up` (and `odl stack deploy`) deploys every deployment of `deploy/prefect.yaml` on "
        "the stack's Prefect server, work pool `odl-pool`. A run's parameters are one object, `params`: "
        "`prefect deployment run odl/full --param 'params={\"epochs\": 5}'`. An unknown or mistyped "
        "parameter is refused before anything starts, naming it and the allowed ones.",
    ]
    for dep in spec["deployments"]:
        entry = dep["entrypoint"]
        schedules = ", ".join(
            f"`{s['cron']}` ({'active' if s.get('active', True) else 'off until you turn it on'})"
            for s in dep.get("schedules", [])
        )
        out += [
            "",
            f"## `odl/{dep['name']}`",
            "",
            cell(dep.get("description", "")),
            "",
            f"- entrypoint: `{entry}`; tags: {', '.join(code(t) for t in dep.get('tags', []))}",
            f"- schedule: {schedules or 'none'} (machine-local time)",
            f"- deployed with: `params = {json.dumps(dep.get('parameters', {}).get('params', {}))}`",
            "",
            _parameters(_params_model(entry)),
        ]
    return "\n".join(out)
