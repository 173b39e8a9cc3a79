"""Flow parameters that refuse what they do not know: a mistyped key fails the run before anything
starts, naming the key, the closest known one and all of them (as recipe keys do).

The parameter schema a deployment stores lists the known keys (``propertyNames``), so a Prefect
server refuses a run with an unknown key at creation (``prefect deployment run ... --param``,
naming the key and the allowed ones); the before-validator gives the same refusal with a "did you
mean" wherever the model is built in-process (``odl flow``, ``odl watch``, a flow called from Python)."""

from __future__ import annotations

import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from tasks.recipe.messages import close_match


def unknown_parameter(key: str, allowed: list[str], where: str) -> str:
    """One line for an unknown ``key``: the closest allowed one and every allowed key."""
    return f"{where}: unknown parameter {key!r} ({close_match(key, allowed)})"


def _strict_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The parameter schema a deployment stores: its keys are an ``enum`` of the known ones, so a
    server refuses an unknown key at creation with jsonschema's own words ("'epoch' is not one of
    ['batch_size', 'board', ...]") and ``prefect deployment inspect`` shows one short list."""
    schema["propertyNames"] = {"enum": sorted(model.model_fields)}
    schema.pop("additionalProperties", None)  # the enum says it, with the allowed keys in its message


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


def run_name(recipe: str | Path, target: str, when: datetime | None = None) -> str:
    """A flow run's name: the recipe, the board (or the fleet's group) and the local time it was
    created or scheduled for, to the second: ``digits@vboard 2026-11-25 02:00:00``."""
    return f"{recipe_name(recipe)}@{target} {(when or datetime.now()).astimezone():%Y-%m-%d %H:%M:%S}"


def flow_run_name(recipe: str | Path, target: str) -> str:
    """The running flow's name (its ``flow_run_name``): the one it was created with when that is
    already ours (``odl watch``, ``odl flow``), else :func:`run_name` at its scheduled start, so a
    ``prefect deployment run`` or a scheduled run is renamed from Prefect's random words when it starts."""
    from prefect.runtime import flow_run  # Prefect only inside a flow run

    current = str(flow_run.name or "")
    if current.startswith(f"{recipe_name(recipe)}@{target} "):
        return current
    start = flow_run.scheduled_start_time
    return run_name(recipe, target, start if isinstance(start, datetime) else None)


def run_tags(recipe: str | Path, target: str, kind: str, fleet: bool = False) -> list[str]:
    """A flow run's tags: ``recipe:<name>``, ``board:<name>`` (``group:`` for a fleet), ``kind:<kind>``."""
    return [f"recipe:{recipe_name(recipe)}", f"{'group' if fleet else 'board'}:{target}", f"kind:{kind}"]


def tag_run(tags: list[str]) -> None:
    """Add ``tags`` to the running flow run (kept with the ones it was created with), on the server and
    in the run's context, so the events emitted from now on carry them too (a ``prefect deployment
    run``'s events carried only its deployment's ``odl``); a no-op outside a flow run."""
    from prefect.client.orchestration import get_client  # Prefect only inside a flow run
    from prefect.context import FlowRunContext  # Prefect only inside a flow run
    from prefect.runtime import flow_run  # Prefect only inside a flow run

    run_id = flow_run.get_id()
    if not run_id:
        return
    have = list(flow_run.get_tags() or [])
    merged = have + [t for t in tags if t not in have]
    with get_client(sync_client=True) as client:
        client.update_flow_run(run_id, tags=merged)
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None:  # what the run's events take their tags from
        context.flow_run.tags = merged


def parameter(name: str, default: str) -> str:
    """A field of the running flow's ``params`` parameter (a dict or the model), else ``default``."""
    from prefect.runtime import flow_run  # Prefect only inside a flow run

    params = (flow_run.parameters or {}).get("params")
    value = params.get(name) if isinstance(params, dict) else getattr(params, name, None)
    return str(value) if value else default
