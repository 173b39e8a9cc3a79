"""Generated classifiers (tests/corpus/generator.py) through the one prepare path: each prepares
or stops with one specific line. CI runs a seeded sample (ODL_CORPUS_EXAMPLES, default 12);
bench/generated.py runs hundreds. Every failing example found so far is kept, shrunk, under
tests/corpus/regressions/ and must now pass."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, seed, settings

from tests.corpus.families import expected, sequence_architectures
from tests.corpus.generator import architectures, prepare_spec

pytestmark = pytest.mark.slow
REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.json"))
EXAMPLES = int(os.environ.get("ODL_CORPUS_EXAMPLES", "12"))
SEQUENCE_EXAMPLES = int(os.environ.get("ODL_CORPUS_SEQUENCE_EXAMPLES", "3"))
RNN = {
    "rnn": "gru",
    "bidirectional": False,
    "layers": 1,
    "dropout": 0.0,
    "pool": "mean",
    "loss": "cross-entropy",
}


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


@seed(20261125)
@settings(
    max_examples=SEQUENCE_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(spec=sequence_architectures())
@example(spec={**RNN, "family": "tokens", "rnn": "lstm", "bidirectional": True, "layers": 2, "dropout": 0.3,
               "padding": True, "strategy": "last-conv+classifier"})  # fmt: skip
@example(spec={**RNN, "family": "conv_rnn", "bidirectional": True, "front": "strided", "strategy": "all"})
@example(spec={**RNN, "family": "conv_rnn", "strategy": "frozen-rnn"})  # the conv trains, the GRU not
@example(spec={"family": "audio", "mels": 4, "head": "gru", "strategy": "all", "loss": "cross-entropy"})
@example(spec={"family": "dscnn", "blocks": 2, "strategy": "last-conv+classifier", "batchnorm_calibration": 32,
               "loss": "cross-entropy"})  # fmt: skip
def test_sequence_audio_and_token_models_prepare_or_stop_with_their_one_line(spec, tmp_path_factory):
    """Token, sequence and audio idioms (tests/corpus/families.py) prepare, their probe trains, or
    prepare stops with the one line their recipe calls for (a frozen recurrent layer between
    trainable ones, a buffer named as a parameter)."""
    kind, message = prepare_spec(spec, tmp_path_factory.mktemp("sequence"))
    want = expected(spec)
    if want == "pass":
        assert kind == "pass", f"{message}\nspec: {json.dumps(spec)}"
    else:
        assert kind == "specific" and re.search(want, message), f"{message}\nspec: {json.dumps(spec)}"
