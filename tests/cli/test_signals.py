"""SIGTERM and SIGHUP end ``odl`` as Ctrl-C does: every cleanup runs, one line, status 128 + the
signal, and no ``.partial`` folder survives; what a SIGKILLed prepare left, the next one removes.

A signalled prepare is held mid-build (``$ODL_TEST_HOLD``, :func:`tasks.prepare.staging.hold`: after
the export, its temporary folder holding model.onnx) until the signal has been sent, so the signal
never comes after the prepare ended, however loaded the machine."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import cli
from tasks.exits import interrupted_exit
from tasks.prepare.staging import HOLD_ENV, hold
from tests.prepare.kit import write_recipe


def _start_prepare(folder: Path, *extra: str, held: Path | None = None) -> subprocess.Popen:
    """``odl prepare`` of the kit's recipe into ``folder/out``; ``held``: a FIFO to hold it on."""
    write_recipe(folder)
    odl = Path(sys.executable).with_name("odl")
    env = os.environ | {"ODL_HOME": str(folder / "home")}
    if held is not None:
        os.mkfifo(held)
        env[HOLD_ENV] = f"exported={held}"
    argv = [str(odl), "prepare", "recipe.toml", "--out", "out", *extra]
    return subprocess.Popen(
        argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_dispositions,
    )  # fmt: skip


def _default_dispositions() -> None:
    """In the child before it starts: the stop signals at their defaults, as a terminal's ``odl`` has
    them. A test run under ``nohup`` or as a shell's background job (``nohup make test &``) hands its
    children SIGHUP, SIGINT and SIGQUIT ignored, which an ignored signal keeps across exec (and
    Python installs no handler of its own for an ignored SIGINT): the signalled prepare ran on."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _when_held(fifo: Path, proc: subprocess.Popen) -> int:
    """Wait until the prepare holds on ``fifo`` (its reader is open), or fail when it ended first;
    the FIFO's write end: closing it lets the prepare go on, so close it only once it was signalled."""
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        if proc.poll() is not None:
            pytest.fail(f"prepare ended (status {proc.returncode}) before its hold:\n{proc.communicate()[1]}")
        time.sleep(0.05)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".out", "out")))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_mid_prepare_prints_one_line_and_leaves_no_folder(tmp_path, sig):
    proc = _start_prepare(tmp_path, held=tmp_path / "hold")
    release = _when_held(tmp_path / "hold", proc)
    assert [p.parent.name.startswith(".out.partial-") for p in tmp_path.glob(".out*/model.onnx")] == [True]
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        os.close(release)
    lines = [line for line in err.splitlines() if line.startswith("odl: ")]
    said = "" if sig == signal.SIGINT else f" ({sig.name})"
    assert proc.returncode == interrupted_exit(sig) == 128 + sig, err
    assert lines == [f"odl: interrupted{said}"] and "Traceback" not in err, err
    assert _left(tmp_path) == []


def test_what_a_sigkilled_prepare_left_the_next_prepare_removes(tmp_path):
    proc = _start_prepare(tmp_path, "--no-validate", held=tmp_path / "hold")
    release = _when_held(tmp_path / "hold", proc)
    proc.kill()
    proc.communicate(timeout=60)
    os.close(release)
    assert [p.startswith(".out.partial-") for p in _left(tmp_path)] == [True]
    again = _start_prepare(tmp_path, "--no-validate")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert _left(tmp_path) == ["out"]


def test_the_hold_waits_only_at_the_point_it_names(tmp_path, monkeypatch):
    missing = tmp_path / "no-fifo"
    monkeypatch.setenv(HOLD_ENV, f"validated={missing}")
    hold("exported")  # another point: it returns without opening anything
    monkeypatch.delenv(HOLD_ENV)
    hold("exported")
    monkeypatch.setenv(HOLD_ENV, f"exported={missing}")
    with pytest.raises(FileNotFoundError):  # its point: it opens the FIFO the variable names
        hold("exported")


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
