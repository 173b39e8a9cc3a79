"""The strategy registry (tasks.fleet.strategies): the names the recipe accepts are the names it
knows, each maps to its own class in its own module, and an unknown name is a recipe error naming
``fleet.strategy``.

The recipe layer sits below the fleet layer (pyproject's import-linter contract), so
``tasks.recipe.schema.FLEET_STRATEGIES`` cannot be read off the registry: this test keeps them equal,
and the fleet flow's ``strategy`` parameter (a ``Literal`` of the same names) too."""

from __future__ import annotations

import typing

import pytest

from flows.fleet import FleetParams
from tasks.errors import RecipeError
from tasks.fleet.strategies import STRATEGIES, Strategy, make_strategy
from tasks.recipe.extras import FLEET_STRATEGIES, FleetSpec


def test_the_recipe_schema_lists_the_registry_names():
    assert set(FLEET_STRATEGIES) == set(STRATEGIES)
    assert len(FLEET_STRATEGIES) == len(set(FLEET_STRATEGIES))


def test_the_fleet_flow_offers_the_registry_names():
    literal, _ = typing.get_args(FleetParams.model_fields["strategy"].annotation)
    assert set(typing.get_args(literal)) == set(STRATEGIES)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_name_makes_a_fresh_strategy_of_its_own_module(name):
    cls = STRATEGIES[name]
    assert issubclass(cls, Strategy) and cls.__module__ == f"tasks.fleet.strategies.{name}"
    spec = FleetSpec(strategy=name, server_lr=0.5)
    a, b = make_strategy(spec), make_strategy(spec)
    assert type(a) is cls and a is not b and a.spec is spec and a.rounds == 0


def test_an_unknown_name_is_a_recipe_error_naming_the_field_and_the_choices():
    with pytest.raises(RecipeError, match="fleet.strategy") as err:
        make_strategy(FleetSpec(strategy="fedprox"))
    assert err.value.field == "fleet.strategy" and err.value.got == "fedprox"
    assert all(repr(name) in str(err.value) for name in STRATEGIES)
