"""Flow parameters refuse unknown keys wherever they are built (``odl flow``, Python, a deployment's
schema), naming the key, a close match and the allowed keys."""

from __future__ import annotations

import jsonschema
import pytest
from pydantic import ValidationError

from flows.fleet import FleetParams
from flows.odl import OdlParams
from tasks.prefect.params import near_misses


def test_unknown_keys_are_refused_with_a_suggestion():
    with pytest.raises(ValidationError, match=r"unknown parameter 'epoch' \(did you mean epochs\? allowed: "):
        OdlParams.model_validate({"epoch": 3})
    with pytest.raises(ValidationError, match=r"unknown parameter 'round' \(did you mean rounds\?"):
        FleetParams.model_validate({"round": 2})
    with pytest.raises(ValidationError, match=r"unknown parameter 'colour' \(allowed: batch_size, board"):
        OdlParams.model_validate({"colour": 1})
    assert OdlParams.model_validate({"epochs": 3}).epochs == 3


@pytest.mark.parametrize("model", [OdlParams, FleetParams])
def test_the_deployment_schema_answers_every_typo_and_accepts_every_key(model):
    validator = jsonschema.Draft202012Validator(model.model_json_schema())
    for key in model.model_fields:
        assert not list(validator.iter_errors({})), key
        for typo in {key[:-1], key[1:], key + "s", key[:1] + key[2:]} - set(model.model_fields):
            errors = [e.message for e in validator.iter_errors({typo: 1})]
            assert errors and "did you mean" in errors[0], (typo, errors)
    assert "a known parameter" in next(validator.iter_errors({"zzzzzzzz": 1})).message


def test_near_misses_are_one_edit_away():
    import re

    pattern = re.compile("^(?:" + "|".join(near_misses("lr")) + ")$")
    assert all(pattern.match(t) for t in ("l", "r", "rl", "lrr", "xlr", "lx"))
    assert not pattern.match("learning_rate")
