"""The fleet overview ``odl-boards``: free disk and RAM from what a run saw, short cells."""

from __future__ import annotations

import re

from device_agent.messages import BoardInfo
from tasks.judge.registry import Registry, decide
from tasks.prefect import boards
from tasks.recipe.extras import PromotionSpec

SIZE = re.compile(r"^\d+(\.\d+)? [KMGT]?B$")


def _registry(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    reg = Registry(tmp_path / "registry")
    rule = PromotionSpec(significance=None, metric="accuracy", min_gain=0.0)
    reg.record(
        "digits",
        "vb1",
        model,
        {"accuracy": 0.953125},
        decide({"accuracy": 0.953125}, {"accuracy": 0.8}, rule, "base"),
    )
    return reg


def test_a_deployment_fills_in_disk_and_ram(agent_board, tmp_path, monkeypatch):
    """A run's deployment (the agent's real ``info`` answer, as on the virtual board) gives the
    overview the board's free disk and RAM; a board check's longer figures are shortened to the size."""
    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(boards, "emit", lambda *a, **k: None)  # no Prefect server here
    answer = agent_board.run("info")
    assert answer.code == 0, answer.err
    info = BoardInfo.from_dict(answer.last)
    boards.heartbeat("vb1", True, boards.free_space(info))
    boards.heartbeat("vb2", True, {"disk": "55.4 GB free of 252.0 GB", "ram": "812 MB available"})
    rows = {r["board"]: r for r in boards.overview_rows(["vb1", "vb2", "vb3"], _registry(tmp_path))}
    assert SIZE.match(rows["vb1"]["disk free"]) and SIZE.match(rows["vb1"]["RAM free"]), rows["vb1"]
    assert (rows["vb2"]["disk free"], rows["vb2"]["RAM free"]) == ("55.4 GB", "812 MB")
    assert rows["vb3"]["reachable"] == "not checked" and rows["vb3"]["disk free"] == "-"
    assert rows["vb1"]["serving"] == "digits v0001 accuracy 0.953"
    assert re.match(r"^\d\d-\d\d \d\d:\d\d$", rows["vb1"]["last training"]), rows["vb1"]


def test_overview_cells_are_short(tmp_path, monkeypatch):
    """No sideways scrolling for one recipe per board: every cell but a board's events fits 30
    characters (a model served, a time, a size)."""
    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(boards, "emit", lambda *a, **k: None)  # no Prefect server here
    boards.heartbeat(
        "vb1", True, {"disk": "1234.5 GB free of 2000.0 GB at /home/odl", "ram": "3.9 GB available"}
    )
    for row in boards.overview_rows(["vb1"], _registry(tmp_path)):
        long = {k: v for k, v in row.items() if "events" not in k and len(str(v)) > 30}
        assert not long, long
