"""Generated classifiers (tests/corpus/generator.py) through the one prepare path: each prepares
or stops with one specific line. CI runs a seeded sample (ODL_CORPUS_EXAMPLES, default 12);
bench/generated.py runs hundreds. Every failing example found so far is kept, shrunk, under
tests/corpus/regressions/ and must now pass."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings

from tests.corpus.generator import architectures, prepare_spec

pytestmark = pytest.mark.slow
REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.json"))
EXAMPLES = int(os.environ.get("ODL_CORPUS_EXAMPLES", "12"))


@seed(20261124)
@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(spec=architectures())
def test_generated_models_prepare_or_stop_with_one_specific_line(spec, tmp_path_factory):
    kind, message = prepare_spec(spec, tmp_path_factory.mktemp("generated"))
    assert kind in ("pass", "specific"), f"{message}\nspec: {json.dumps(spec)}"


@pytest.mark.parametrize("case", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_shrunk_failures_found_by_the_generator_now_pass(case, tmp_path):
    kind, message = prepare_spec(json.loads(case.read_text())["spec"], tmp_path)
    assert kind == "pass", message
