"""After a full ``odl run`` on the virtual board: the private key never appears in logs, events,
results or run folders, and nothing under the board's agent root is group- or world-writable."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tasks.board.inventory import Board
from tasks.board.transport import connect
from tasks.paths import PROJECT_ROOT
from tests.fixtures_board import odl_home_env

pytestmark = [pytest.mark.board, pytest.mark.slow]


def _key_fragments(key: Path) -> list[str]:
    body = [ln.strip() for ln in key.read_text().splitlines() if ln.strip() and not ln.startswith("-----")]
    joined = "".join(body)
    return [*body, *(joined[i : i + 24] for i in range(0, len(joined) - 24, 24))]


def test_full_run_leaks_no_key_and_leaves_no_writable_file(
    virtual_board: Board, virtual_board_home: Path, tmp_path: Path, caplog
) -> None:
    from tasks.stages.run import run_on_board

    caplog.set_level(logging.DEBUG)
    out = tmp_path / "run"
    with odl_home_env(virtual_board_home):
        summary = run_on_board(PROJECT_ROOT / "recipes" / "digits.toml", virtual_board.name, out,
                               overrides={"training.epochs": 2}, validate=False)  # fmt: skip
    assert summary.training.result.status == "finished"
    fragments = _key_fragments(Path(virtual_board.key))
    assert len(fragments) > 3
    texts = {"host log": caplog.text}
    for folder in (out, virtual_board_home, summary.prepared_dir):
        for path in folder.rglob("*"):
            is_key = path.name.startswith(("id_ed25519", "ssh_host_ed25519_key"))  # where keys live
            if path.is_file() and path.stat().st_size < 50 * 2**20 and not is_key:
                texts[str(path)] = path.read_bytes().decode(errors="replace")
    conn = connect(virtual_board)
    try:
        jdir = f"{virtual_board.root}/jobs/{summary.job_id}"
        for name in ("events.jsonl", "result.json", "agent.log", "agent.stderr", "job.json"):
            texts[f"board:{name}"] = conn.read_from(f"{jdir}/{name}", 0).decode(errors="replace")
        writable = conn.run(["find", virtual_board.root, "!", "-type", "l", "-perm", "/022"]).stdout
    finally:
        conn.close()
    leaks = [where for where, text in texts.items() if any(f in text for f in fragments)]
    assert leaks == []
    assert writable.split() == [], "group/world-writable files on the board"
    assert os.stat(virtual_board.key).st_mode & 0o077 == 0
