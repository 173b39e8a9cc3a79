"""Flow parameters that refuse what they do not know: a mistyped key fails the run before anything
starts, naming the key, the closest known one and all of them (as recipe keys do).

Pydantic's ``extra="forbid"`` puts ``additionalProperties: false`` into the parameter schema a
deployment stores, so a Prefect server that enforces the schema refuses the run at creation
(``prefect deployment run ... --param``); the before-validator gives the same refusal, with its
suggestion, wherever the model is built in-process (``odl flow``, a flow called from Python)."""

from __future__ import annotations

import re
import tomllib
from datetime import date
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from tasks.recipe.messages import close_match


def unknown_parameter(key: str, allowed: list[str], where: str) -> str:
    """One line for an unknown ``key``: the closest allowed one and every allowed key."""
    return f"{where}: unknown parameter {key!r} ({close_match(key, allowed)})"


def near_misses(key: str) -> list[str]:
    """Regular expressions of every name one edit away from ``key`` (a character dropped, added,
    changed, or two swapped): the typos a schema can answer with "did you mean <key>?"."""
    k = [re.escape(c) for c in key]
    out = {"".join(k[:i] + k[i + 1 :]) for i in range(len(k))}
    out |= {"".join(k[:i] + ["."] + k[i + 1 :]) for i in range(len(k))}
    out |= {"".join(k[:i] + ["."] + k[i:]) for i in range(len(k) + 1)}
    out |= {"".join(k[:i] + [k[i + 1], k[i]] + k[i + 2 :]) for i in range(len(k) - 1)}
    return sorted(o for o in out if o)


def _strict_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The parameter schema a deployment stores: a key one edit away from a known one fails with
    "did you mean <known>?", any other unknown key with the list of known ones (the server's
    message quotes the ``const`` it expected), known keys never match either rule."""
    allowed = sorted(model.model_fields)
    listing = f"(allowed: {', '.join(allowed)})"
    known = "|".join(re.escape(a) for a in allowed)
    patterns = {
        f"^(?!(?:{known})$)(?:{'|'.join(near_misses(a))})$": {"const": f"did you mean {a}? {listing}"}
        for a in allowed
    }
    schema["patternProperties"] = patterns
    schema["additionalProperties"] = {"const": f"a known parameter {listing}"}


class StrictParams(BaseModel):
    """A flow's parameters: unknown keys are refused, with a close match suggested."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_strict_schema)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = list(cls.model_fields)
            for key in data:
                if key not in allowed:
                    raise ValueError(unknown_parameter(str(key), allowed, f"{cls.__name__} parameters"))
        return data


def recipe_name(recipe: str | Path) -> str:
    """The ``name`` a recipe file declares (its file stem when it cannot be read): what run names,
    tags, the registry and reports call it."""
    path = Path(recipe).expanduser()
    try:
        name = tomllib.loads(path.read_text()).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        name = None
    return name if isinstance(name, str) and name else path.stem


def run_name(recipe: str | Path, target: str, day: date | None = None) -> str:
    """A flow run's name, the same at creation (``make demo``) and in the flow:
    ``digits@vboard-2026-11-25``; ``target`` is the board or the fleet's group."""
    return f"{recipe_name(recipe)}@{target}-{(day or date.today()).isoformat()}"


def run_tags(recipe: str | Path, target: str, kind: str, fleet: bool = False) -> list[str]:
    """A flow run's tags: ``recipe:<name>``, ``board:<name>`` (``group:`` for a fleet), ``kind:<kind>``."""
    return [f"recipe:{recipe_name(recipe)}", f"{'group' if fleet else 'board'}:{target}", f"kind:{kind}"]


def tag_run(tags: list[str]) -> None:
    """Add ``tags`` to the running flow run (kept with the ones it was created with); a no-op
    outside a flow run."""
    from prefect.client.orchestration import get_client  # Prefect only inside a flow run
    from prefect.runtime import flow_run  # Prefect only inside a flow run

    run_id = flow_run.get_id()
    if not run_id:
        return
    have = list(flow_run.get_tags() or [])
    with get_client(sync_client=True) as client:
        client.update_flow_run(run_id, tags=have + [t for t in tags if t not in have])


def parameter(name: str, default: str) -> str:
    """A field of the running flow's ``params`` parameter (a dict or the model), else ``default``."""
    from prefect.runtime import flow_run  # Prefect only inside a flow run

    params = (flow_run.parameters or {}).get("params")
    value = params.get(name) if isinstance(params, dict) else getattr(params, name, None)
    return str(value) if value else default
