"""The fleet overview ``odl-boards``: free disk and RAM from what a run saw, short cells."""

from __future__ import annotations

import re
import time

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
    disk, ram = rows["vb1"]["free"].split("<br>")
    assert SIZE.match(disk.removeprefix("disk ")) and SIZE.match(ram.removeprefix("RAM ")), rows["vb1"]
    assert rows["vb2"]["free"] == "disk 55.4 GB<br>RAM 812 MB"
    assert (
        rows["vb3"]["reachable"] == "not checked"
        and rows["vb3"]["free"] == f"disk {boards.NONE}<br>RAM {boards.NONE}"
    )
    assert re.match(r"^yes<br>\d\d:\d\d$", rows["vb1"]["reachable"]), rows["vb1"]  # checked today: the time
    assert re.match(r"^digits v0001<br>accuracy 0.953<br>promoted \d\d:\d\d$", rows["vb1"]["serving"]), rows[
        "vb1"
    ]
    assert re.match(r"^\d\d:\d\d$", rows["vb1"]["trained"]), rows["vb1"]
    assert all(v != "-" for row in rows.values() for v in row.values())  # "-" shows as a bullet in the UI


def test_overview_lines_are_short(tmp_path, monkeypatch):
    """No sideways scrolling at 1280 px (the UI's table has 724 px there; measured in headless
    Chromium: ten columns of one line each were 1489 px wide, these six fit without a scrollbar):
    six columns, and every line of a cell but a link fits 25 characters."""
    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(boards, "emit", lambda *a, **k: None)  # no Prefect server here
    boards.heartbeat(
        "vb1", True, {"disk": "1234.5 GB free of 2000.0 GB at /home/odl", "ram": "3.9 GB available"}
    )
    ago = time.time() - 35 * 86400  # five weeks: the longest ages ("35 d ago")
    events = {"vb1": [("odl.board.heartbeat", ago), ("odl.job.finished", ago), ("odl.job.progress", ago)]}
    rows = boards.overview_rows(["vb1"], _registry(tmp_path), events, "http://127.0.0.1:4200")
    assert len(rows[0]) == 6
    lines = [line for v in rows[0].values() for line in str(v).split("<br>") if not line.startswith("[")]
    assert max(len(line) for line in lines) <= 25, lines
