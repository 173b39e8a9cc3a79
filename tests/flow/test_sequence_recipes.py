"""The token and sequence reference recipes through the whole flow on the local board (issue 37):
recipes/tokens.toml feeds int64 token ids to an Embedding + GRU, recipes/sequence.toml accelerometer
windows to a Conv1d + GRU; each trains its GRU and classifier on the board (the last recurrent
layer is the default strategy's last layer) and is promoted on a significant gain of its accuracy,
the host domain guarded. tests/e2e/test_flow_vboard.py's board fixture runs them on the virtual
board the same way."""

from __future__ import annotations

import json

import pytest

from tests.flow.test_flow import _run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("recipe", ["tokens.toml", "sequence.toml"], ids=["tokens", "sequence"])
def test_reference_recipe_is_promoted_on_a_significant_gain(prefect_harness, flow_home, flow_board, recipe):
    from tasks import stages
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe

    path = PROJECT_ROOT / "recipes" / recipe
    _, out = _run(flow_board.name, recipe=str(path))
    print(f"{recipe}: {out.summary}; timings {out.timings}")  # the figures, shown with -s
    base, cand = out.metrics["base"]["accuracy"], out.metrics["candidate"]["accuracy"]
    assert out.promoted, (base, cand)  # McNemar significant, the host domain within 0.05 of the base
    assert cand - base > 0.3  # the board's domain, before and after its training
    manifest = json.loads((stages.inputs(load_recipe(path)).folder / "manifest.json").read_text())
    layers = {row["layer"]: row["params"] for row in manifest["trainable_layers"]}
    assert layers == {"gru": 4800, "classifier": 132}  # the embedding or conv stays frozen
