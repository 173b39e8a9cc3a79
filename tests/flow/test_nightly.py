"""Nightly continual learning end to end (issue 13): data appended to the board between runs,
warm starts from the model in service, a promotion rolled out to the board, a rejection by the
gate's statistics, and a rollback. tests/e2e/test_flow_vboard.py runs it on the virtual board."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest

from tasks.judge.decision import decision_from_dict, headline
from tests.flow.test_flow import _artifacts, _run

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "digits_nightly.toml"


def _odl(*args: str) -> int:
    from flows.cli import main

    return main(list(args))


def _board_models(board) -> dict:
    from tasks.board.releases import board_models
    from tasks.board.transport import connect

    conn = connect(board)
    try:
        return board_models(conn, board, "digits_nightly")
    finally:
        conn.close()


def _fresh_board_folders(board, subs=("datasets/digits", "models/digits_nightly")) -> None:
    from tasks.board.transport import connect

    conn = connect(board)
    try:
        for sub in subs:
            conn.run(["rm", "-rf", posixpath.join(board.root, sub)])
    finally:
        conn.close()


@pytest.mark.vboard
def test_nightly_cycles_promote_reject_rollout_and_rollback(prefect_harness, flow_home, flow_board, capsys):
    from tasks import stages
    from tasks.recipe.load import load_recipe

    board = flow_board
    recipe = load_recipe(RECIPE)
    stages.prepare_data(recipe)
    shards = RECIPE.parent / "data" / "digits-nightly" / "shards"
    _fresh_board_folders(board)
    reg = stages.registry()
    before = len(reg.versions("digits_nightly", board.name))

    def night(shard: str):
        assert _odl("data", "push", board.name, str(shards / shard), "--to", "datasets/digits") == 0
        run_id, out = _run(board.name, recipe=str(RECIPE))
        version = next(v for v in reg.versions("digits_nightly", board.name) if v.name == out.version)
        reports[version.name] = _artifacts(run_id)[f"odl-report-digits-nightly-{board.name}"].data
        return out, version

    reports: dict[str, str] = {}

    # day 0: the first shard; nothing in service yet, so the run starts from the recipe's weights
    out0, v0 = night("shard-0001.npz")
    assert out0.promoted and v0.info["start_from"] == {"from": "base"}
    data0 = v0.info["board_data"]
    assert [f["name"] for f in data0["files"]] == ["shard-0001.npz"] and data0["samples"] == 200
    served = _board_models(board)["current"]
    assert served["version"] == v0.name and served["verified"]
    assert served["files"]["model.onnx"] == v0.info["files_sha256"]["model.onnx"]

    # night 1: 300 new samples appended; warm start from v0, old data replayed
    out1, v1 = night("shard-0002.npz")
    assert v1.info["start_from"]["from"] == v0.name
    assert v1.info["start_from"]["model_sha256"] == v0.info["model_sha256"]
    data1 = v1.info["board_data"]
    assert data1["new"] == ["shard-0002.npz"] and data1["replayed"] == ["shard-0001.npz"]
    assert out1.promoted, v1.info["reason"]
    assert v1.info["decision"]["significance"]["significant"]
    models = _board_models(board)
    assert models["current"]["version"] == v1.name and models["previous"]["version"] == v0.name
    report = reports[v1.name]  # the run's lineage and the metric across versions, in the UI
    assert f"**Warm start** from `{v0.name}`" in report
    assert "new: shard-0002.npz; replayed: shard-0001.npz" in report
    assert f"**Serving on the board**: serving on {board.name}" in report
    assert "## Promoted metric across versions" in report and f"| {v1.name} | 0.8" in report

    # a night when the board application added nothing: "No new data", not failed, nothing recorded
    from flows.odl import OdlParams, odl

    state = odl(OdlParams(board=board.name, recipe=str(RECIPE)), return_state=True)
    assert state.is_completed() and state.message.startswith("No new data: "), state.message
    assert "no new file in" in state.message
    assert len(reg.versions("digits_nightly", board.name)) == before + 2

    # night 2: 100 more samples; the candidate grows from v1 but its gain is not significant
    out2, v2 = night("shard-0003.npz")
    assert v2.info["start_from"]["from"] == v1.name
    assert v2.info["board_data"]["new"] == ["shard-0003.npz"]
    assert not out2.promoted
    reason = v2.info["reason"]  # one story: the failing checks first, in the registry, report and CLI
    failing = [c["name"] for c in v2.info["decision"]["checks"] if not c["holds"]]
    assert failing and reason.startswith(f"FAIL {failing[0]}: ") and "McNemar" in reason, reason
    assert all(f"FAIL {name}: " in reason for name in failing)
    decision = decision_from_dict(v2.info["decision"])
    assert headline(decision) in reports[v2.name]  # the report leads with the verdict's headline
    assert all(c["text"] in reports[v2.name] for c in decision.checks)  # and gives every check's sentence
    capsys.readouterr()
    assert _odl("registry", "digits_nightly", board.name) == 0
    listing = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 160 for line in listing), listing  # one readable line a version, details after
    at = next(i for i, line in enumerate(listing) if line.startswith(f"  {v2.name}  rejected  "))
    assert f"; fails: {decision.failing()[0]['short']}" in listing[at]
    after = " ".join(" ".join(listing[at + 1 :]).split())
    assert all(f"FAIL {name}: " in after for name in failing) and f"run {v2.info['flow_run_id']}" in after
    # what each night still knows of the earlier shards (held-out parts), BWT and forgetting
    report = reports[v2.name]
    assert "## What each night still knows (continual learning)" in report
    assert "| night | promoted | new shards | BWT | forgetting |" in report
    assert "| night | shard-0001 | shard-0002 | shard-0003 |" in report
    assert f"| {v2.name} | no | shard-0003 | " in report and f"| {v1.name} | yes | shard-0002 | " in report
    assert set(v2.metrics["heldout"]) == {"shard-0001", "shard-0002", "shard-0003"}
    assert reg.current("digits_nightly", board.name).name == v1.name
    assert _board_models(board)["current"]["version"] == v1.name  # the board kept serving v1

    # rollback: v0 serves again, on the board (hash-verified) and in the registry
    assert _odl("rollback", "digits_nightly", board.name) == 0
    assert reg.current("digits_nightly", board.name).name == v0.name
    models = _board_models(board)
    assert models["current"]["version"] == v0.name and models["current"]["verified"]
    assert models["previous"]["version"] == v1.name
    assert len(reg.versions("digits_nightly", board.name)) == before + 3  # nothing recorded is lost
