"""The recipe schema written once (tasks/recipe/schema.py): the JSON Schema editors read is the
committed one and agrees with the loader; objects built in code are validated like files; the flows'
parameters take their bounds from the schema.

``.venv/bin/odl recipe schema --out recipes/recipe.schema.json`` regenerates the committed schema.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from flows.cli import main
from flows.fleet import FleetParams
from flows.odl import OdlParams
from tasks.errors import RecipeError
from tasks.paths import PROJECT_ROOT
from tasks.recipe.extras import FleetSpec, PromotionSpec, QuantizeSpec
from tasks.recipe.load import json_schema, json_schema_text, load_recipe, parse_recipe
from tasks.recipe.messages import describe
from tasks.recipe.training import LossSpec, OptimizerSpec, TrainingSpec
from tests.prepare.kit import BASE, merge

jsonschema = pytest.importorskip("jsonschema")  # Prefect's dependency: checks the schema as an editor would

RECIPES = PROJECT_ROOT / "recipes"
SCHEMA_FILE = RECIPES / "recipe.schema.json"
REFERENCE = sorted(RECIPES.glob("*.toml"))

# flow parameter -> (the schema table, its field, the dotted override the parameter sets)
ODL_PARAMS = {
    "epochs": (TrainingSpec, "epochs", "training.epochs"),
    "batch_size": (TrainingSpec, "batch_size", "training.batch_size"),
    "lr": (OptimizerSpec, "lr", "optimizer.lr"),
    "promotion_min_gain": (PromotionSpec, "min_gain", "promotion.min_gain"),
}
FLEET_PARAMS = {
    "rounds": (FleetSpec, "rounds", "fleet.rounds"),
    "min_boards": (FleetSpec, "min_boards", "fleet.min_boards"),
    "deadline_s": (FleetSpec, "deadline_s", "fleet.deadline_s"),
    "strategy": (FleetSpec, "strategy", "fleet.strategy"),
    "mode": (FleetSpec, "mode", "fleet.mode"),
    "buffer_size": (FleetSpec, "buffer_size", "fleet.buffer_size"),
    "epochs": (TrainingSpec, "epochs", "training.epochs"),
    "lr": (OptimizerSpec, "lr", "optimizer.lr"),
}


def test_the_committed_json_schema_is_up_to_date():
    assert SCHEMA_FILE.read_text() == json_schema_text(), (
        "run: .venv/bin/odl recipe schema --out recipes/recipe.schema.json"
    )


def test_odl_recipe_schema_writes_it(tmp_path, capsys):
    assert main(["recipe", "schema", "--out", str(tmp_path / "s.json")]) == 0
    assert (tmp_path / "s.json").read_text() == json_schema_text()
    assert "wrote" in capsys.readouterr().out
    assert main(["recipe", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema()


@pytest.mark.parametrize("path", REFERENCE, ids=lambda p: p.stem)
def test_an_editor_accepts_every_reference_recipe(path: Path):
    validator = jsonschema.Draft7Validator(json_schema())
    assert [e.message for e in validator.iter_errors(tomllib.loads(path.read_text()))] == []
    load_recipe(path)  # and so does the loader


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"training": {"epochs": 0}}, "minimum"),
        ({"training": {"epoch": 3}}, "epoch"),
        ({"loss": {"kind": "hinge"}}, "hinge"),
        ({"promotion": {"significance": True}}, "True"),
        ({"data": {"board_select": "latest"}}, "latest"),
        ({"model": {"input_shape": [1, 0]}}, "0"),
    ],
)
def test_an_editor_flags_what_the_loader_refuses(tmp_path, change, word):
    data = merge(BASE, change)
    errors = [e.message for e in jsonschema.Draft7Validator(json_schema()).iter_errors(data)]
    assert errors and word in " ".join(errors)
    with pytest.raises(RecipeError):
        parse_recipe(data, tmp_path / "r.toml")


def test_an_unknown_key_names_the_closest_known_one(tmp_path):
    with pytest.raises(RecipeError, match=r"'training\.epoch'.*did you mean epochs\?"):
        parse_recipe(merge(BASE, {"training": {"epoch": 3}}), tmp_path / "r.toml")
    with pytest.raises(RecipeError, match="'source': expected a known key"):
        parse_recipe(merge(BASE, {"source": "x.toml"}), tmp_path / "r.toml")


def test_replace_validates_like_the_loader(tmp_path):
    recipe = parse_recipe(BASE, tmp_path / "r.toml")
    longer = dataclasses.replace(recipe, training=dataclasses.replace(recipe.training, epochs=7))
    assert (longer.training.epochs, longer.source, longer.raw) == (7, recipe.source, recipe.raw)
    with pytest.raises(RecipeError, match=r"'training\.epochs': expected an integer in \[1, 100000\]") as err:
        dataclasses.replace(recipe.training, epochs=0)
    assert (err.value.field, err.value.got) == ("training.epochs", 0)
    with pytest.raises(RecipeError, match="'quantize.method'"):
        QuantizeSpec(tmp_path / "c.npz", method="kl")
    with pytest.raises(RecipeError, match="'promotion.metric'"):  # a rule across the recipe's tables
        dataclasses.replace(recipe, task="regression")


def test_rebuilding_from_fields_gives_the_same_object():
    """Prefect rebuilds dataclasses from their fields (visit_collection): validation is idempotent."""
    for path in REFERENCE:
        recipe = load_recipe(path)
        tables = [getattr(recipe, f.name) for f in dataclasses.fields(recipe)]
        for table in [recipe, *(t for t in tables if dataclasses.is_dataclass(t))]:
            fields = {f.name: getattr(table, f.name) for f in dataclasses.fields(table)}
            assert type(table)(**fields) == table


def test_custom_loss_kind_is_split_once():
    loss = LossSpec("custom:models:two_head_loss")
    assert (loss.kind, loss.factory) == ("custom", "models:two_head_loss")
    assert LossSpec(loss.kind, loss.factory) == loss
    with pytest.raises(RecipeError, match="'loss.kind'"):
        LossSpec("custom")


@pytest.mark.parametrize(
    ("model", "params"), [(OdlParams, ODL_PARAMS), (FleetParams, FLEET_PARAMS)], ids=["odl", "fleet"]
)
def test_flow_parameters_take_bounds_and_help_from_the_schema(model, params):
    for name, (table, field, dotted) in params.items():
        spec = table.__pydantic_fields__[field]
        param = model.model_fields[name]
        assert describe(param.annotation) == describe(spec.annotation, spec.metadata), name
        where, key = dotted.split(".")
        assert param.default is None and f"override [{where}].{key}" in (param.description or ""), name
        assert dotted in model(**{name: getattr(table(), field)}).recipe_overrides()  # the default
    # fanout says where a round runs (groups on the pool's hosts), not what is trained: no recipe field
    assert set(params) | {"recipe", "board", "group", "overrides", "fanout"} >= set(model.model_fields)


def test_flow_parameters_refuse_what_the_recipe_refuses():
    for bad in ({"epochs": 100_001}, {"batch_size": 0}, {"lr": 0}, {"promotion_min_gain": 2e9}):
        with pytest.raises(ValueError):
            OdlParams(**bad)
    for bad in ({"rounds": 0}, {"deadline_s": 0}, {"strategy": "fedsgd"}, {"min_boards": 10_001}):
        with pytest.raises(ValueError):
            FleetParams(**bad)
