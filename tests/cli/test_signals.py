"""SIGTERM and SIGHUP end ``odl`` as Ctrl-C does: every cleanup runs, one line, status 128 + the
signal, and no ``.partial`` folder survives; what a SIGKILLed prepare left, the next one removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import cli
from tasks.exits import interrupted_exit
from tests.prepare.kit import write_recipe


def _start_prepare(folder: Path, *extra: str) -> subprocess.Popen:
    write_recipe(folder)
    odl = Path(sys.executable).with_name("odl")
    env = os.environ | {"ODL_HOME": str(folder / "home")}
    argv = [str(odl), "prepare", "recipe.toml", "--out", "out", *extra]
    return subprocess.Popen(
        argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _when_building(folder: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until the prepare has its temporary folder (mid-prepare), or fail."""
    deadline = time.monotonic() + timeout
    while not list(folder.glob(".out.partial-*")):
        assert proc.poll() is None and time.monotonic() < deadline, "prepare ended before it built anything"
        time.sleep(0.05)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".out", "out")))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_mid_prepare_prints_one_line_and_leaves_no_folder(tmp_path, sig):
    proc = _start_prepare(tmp_path)
    _when_building(tmp_path, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.startswith("odl: ")]
    said = "" if sig == signal.SIGINT else f" ({sig.name})"
    assert proc.returncode == interrupted_exit(sig) == 128 + sig, err
    assert lines == [f"odl: interrupted{said}"] and "Traceback" not in err, err
    assert _left(tmp_path) == []


def test_what_a_sigkilled_prepare_left_the_next_prepare_removes(tmp_path):
    proc = _start_prepare(tmp_path, "--no-validate")
    _when_building(tmp_path, proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert [p.startswith(".out.partial-") for p in _left(tmp_path)] == [True]
    again = _start_prepare(tmp_path, "--no-validate")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert _left(tmp_path) == ["out"]


def test_main_turns_sigterm_into_its_interrupted_line_and_restores_the_handler(monkeypatch, capsys):
    def stopped(_args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        return 0

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "dispatch", stopped)
    assert cli.main(["recipe", "schema"]) == 143
    assert capsys.readouterr().err.splitlines() == ["odl: interrupted (SIGTERM)"]
    assert signal.getsignal(signal.SIGTERM) is before
