"""Flow parameters refuse unknown keys wherever they are built (``odl flow``, Python, a deployment's
schema), naming the key, a close match and the allowed keys."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import ValidationError

from flows.fleet import FleetParams
from flows.odl import OdlParams


def test_unknown_keys_are_refused_with_a_suggestion():
    with pytest.raises(ValidationError, match=r"unknown parameter 'epoch' \(did you mean epochs\? allowed: "):
        OdlParams.model_validate({"epoch": 3})
    with pytest.raises(ValidationError, match=r"unknown parameter 'round' \(did you mean rounds\?"):
        FleetParams.model_validate({"round": 2})
    with pytest.raises(ValidationError, match=r"unknown parameter 'colour' \(allowed: batch_size, board"):
        OdlParams.model_validate({"colour": 1})
    assert OdlParams.model_validate({"epochs": 3}).epochs == 3


@pytest.mark.parametrize("model", [OdlParams, FleetParams])
def test_the_deployment_schema_refuses_unknown_keys_listing_the_known_ones(model):
    """The schema a deployment stores: one list of known keys (no pattern per typo), every known
    key accepted, an unknown one refused in jsonschema's words with the allowed keys."""
    schema = model.model_json_schema()
    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors({key: getattr(model(), key) for key in model.model_fields}))
    (error,) = validator.iter_errors({"epoch": 1})
    assert error.message == f"'epoch' is not one of {sorted(model.model_fields)}"
    assert "patternProperties" not in json.dumps(schema) and len(json.dumps(schema)) < 4000


def test_run_names_tell_runs_apart(tmp_path):
    """Two runs of a recipe on a board within a day have different names: the time to the second."""
    from datetime import datetime

    from tasks.prefect.params import run_name

    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "digits"\n')
    first = run_name(recipe, "vboard", datetime(2026, 11, 25, 2, 0, 0).astimezone())
    assert first == "digits@vboard 2026-11-25 02:00:00"
    assert run_name(recipe, "vboard", datetime(2026, 11, 25, 14, 3, 9).astimezone()) != first
