"""The board agent keeps its own stdlib checks of a job (device_agent/jobspec.py: no pydantic on the
board); this holds them in step with the recipe schema's bounds, read off both sides.

Every value the schema lets through, the agent runs (a job the host sends is never refused on the
board); the schema's lower bounds are the agent's; where the agent has no upper bound (or no bound
at all) the sets below say so, and a bound the agent gains must then equal the schema's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, get_args

import annotated_types as at
import pytest

from device_agent import jobspec, prefix_spec
from device_agent.protocol import TASKS, SpecError, TrainParams
from tasks.recipe.data_table import BoardFormat
from tasks.recipe.schema import Task
from tasks.recipe.training import CACHE_DTYPES, CACHE_STORES, OptimizerSpec, ScheduleSpec, TrainingSpec

# TrainParams field -> the recipe field it is built from (tasks.prepare.board_job.train_params)
FROM_RECIPE: dict[str, tuple[type, str]] = {
    "batch_size": (TrainingSpec, "batch_size"),
    "epochs": (TrainingSpec, "epochs"),
    "lr": (OptimizerSpec, "lr"),
    "warmup_steps": (ScheduleSpec, "warmup_steps"),
    "final_lr_ratio": (ScheduleSpec, "final_lr_ratio"),
    "checkpoint_every": (TrainingSpec, "checkpoint_every"),
    "log_every": (TrainingSpec, "log_every"),
    "seed": (TrainingSpec, "seed"),
}
NOT_FROM_RECIPE = {"max_steps", "drop_last"}  # set by the host's code, not by a recipe field
NO_AGENT_UPPER_BOUND = {"batch_size", "epochs", "lr", "warmup_steps", "checkpoint_every", "log_every", "seed"}
NO_AGENT_LOWER_BOUND = {"seed"}
BASE = TrainParams(batch_size=1, epochs=1, lr=0.1)


def _bounds(table: type, field: str) -> tuple[Any, bool, Any, bool]:
    """The schema's (low, low included, high, high included) for ``table.field``."""
    lo = hi = None
    lo_in = hi_in = True
    for m in table.__pydantic_fields__[field].metadata:
        if isinstance(m, at.Ge | at.Gt):
            lo, lo_in = (m.ge, True) if isinstance(m, at.Ge) else (m.gt, False)
        if isinstance(m, at.Le | at.Lt):
            hi, hi_in = (m.le, True) if isinstance(m, at.Le) else (m.lt, False)
    assert lo is not None and hi is not None, f"{table.__name__}.{field} has no bounds"
    return lo, lo_in, hi, hi_in


def _agent_accepts(field: str, value: Any) -> bool:
    try:
        dataclasses.replace(BASE, **{field: value}).check("train")
    except SpecError as exc:
        assert exc.field == f"train.{field}"
        return False
    return True


def _just(value: Any, name: str, sign: int) -> Any:
    """The value next to ``value`` (above for sign 1, below for -1) in the agent's type for ``name``."""
    floats = {f.name for f in dataclasses.fields(TrainParams) if f.type == "float"}
    return float(value) + sign * 1e-9 if name in floats else int(value) + sign


def test_every_job_parameter_comes_from_a_recipe_field_with_bounds():
    fields = {f.name for f in dataclasses.fields(TrainParams)}
    assert set(FROM_RECIPE) == fields - NOT_FROM_RECIPE
    for table, field in FROM_RECIPE.values():
        _bounds(table, field)


@pytest.mark.parametrize("name", sorted(FROM_RECIPE))
def test_the_agent_runs_every_value_the_schema_allows(name: str):
    lo, lo_in, hi, hi_in = _bounds(*FROM_RECIPE[name])
    low = _just(lo, name, 0) if lo_in else _just(lo, name, 1)
    high = _just(hi, name, 0) if hi_in else _just(hi, name, -1)
    assert _agent_accepts(name, low) and _agent_accepts(name, high)


@pytest.mark.parametrize("name", sorted(FROM_RECIPE))
def test_the_agent_refuses_below_the_schema_and_says_where_it_has_no_bound(name: str):
    lo, lo_in, hi, hi_in = _bounds(*FROM_RECIPE[name])
    below = _just(lo, name, -1 if lo_in else 0)
    above = _just(hi, name, 1 if hi_in else 0)
    assert _agent_accepts(name, below) is (name in NO_AGENT_LOWER_BOUND)
    assert _agent_accepts(name, above) is (name in NO_AGENT_UPPER_BOUND)


def test_the_vocabularies_are_the_agents():
    # one definition: the schema's Task is the protocol's TASKS, and "detection", which loads as "embedded"
    assert get_args(Task) == (*TASKS, "detection") and "detection" not in TASKS
    assert (CACHE_DTYPES, CACHE_STORES) == (prefix_spec.CACHE_DTYPES, prefix_spec.CACHE_STORES)
    assert set(get_args(BoardFormat)) <= set(jobspec.DATA_FORMATS)
