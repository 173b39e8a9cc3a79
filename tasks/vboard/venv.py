"""The board's Python environment on this machine (x86_64): a venv with only numpy and ONNX Runtime.

By default numpy + onnxruntime-training-cpu (``deploy/board-requirements.txt``); given explicit
``requirements`` (e.g. numpy + a plain ``onnxruntime`` of ``deploy/board-requirements-plain.txt``)
it holds those only, never beside onnxruntime-training. Used by tests and by the virtual board to
run the device agent torch-free, exactly as on a STM32MP2 board. Built once per content (a stamp file).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tasks.errors import BoardError
from tasks.paths import PROJECT_ROOT
from tasks.vboard.owner import open_to_board_user

log = logging.getLogger(__name__)

REQUIREMENTS = PROJECT_ROOT / "deploy" / "board-requirements.txt"
CONSTRAINTS = PROJECT_ROOT / "constraints.txt"
STAMP_NAME = ".odl-board-env"
# A system interpreter (as on a board) is readable by every user; pyenv's under /root is not.
SYSTEM_PYTHONS = ("/usr/bin/python3.11", "/usr/bin/python3")


def board_requirements_stamp(requirements: tuple[str, ...] | None = None) -> str:
    """A hash of the board requirements (the default file and constraints, or the explicit
    ``requirements``): the venv is rebuilt when it changes."""
    if requirements is not None:
        return hashlib.sha256("\n".join(("explicit", *requirements)).encode()).hexdigest()
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(CONSTRAINTS.read_bytes())
    return digest.hexdigest()


def base_python() -> str:
    """The interpreter the board venv is built from: a system Python 3 if present, else ours."""
    for cand in SYSTEM_PYTHONS:
        if os.access(cand, os.X_OK):
            return cand
    return sys.executable


def shared_board_venv() -> Path:
    """The board venv the tests and benchmarks share, kept between sessions: ``$ODL_TEST_BOARD_VENV``,
    else one folder per content of the requirements (``/var/tmp/odl-test-board-venv-<stamp>``), so two
    checkouts whose pins differ never rebuild the venv the other's running tests use."""
    named = os.environ.get("ODL_TEST_BOARD_VENV")
    return Path(named) if named else Path(f"/var/tmp/odl-test-board-venv-{board_requirements_stamp()[:12]}")


@open_to_board_user()
def ensure_board_venv(dest: Path, requirements: tuple[str, ...] | None = None) -> Path:
    """Create (idempotently) a venv at ``dest`` with only numpy + onnxruntime-training-cpu, or with
    exactly the pinned ``requirements`` (``("numpy==2.4.6", "onnxruntime==1.19.2")``).

    Returns the venv's python path. A second call with unchanged requirements returns at once.
    Directories are made 0755 so another Linux user (the virtual board's) can run it.
    """
    dest = Path(dest)
    python = dest / "bin" / "python"
    if _is_current(dest, requirements):
        return python
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent builders (two pytest runs) wait for one
        if not _is_current(dest, requirements):
            _build(dest, requirements)
    return python


def _is_current(dest: Path, requirements: tuple[str, ...] | None) -> bool:
    stamp_file = dest / STAMP_NAME
    return (
        (dest / "bin" / "python").exists()
        and stamp_file.exists()
        and (stamp_file.read_text().strip() == board_requirements_stamp(requirements))
    )


def _build(dest: Path, requirements: tuple[str, ...] | None) -> None:
    python = dest / "bin" / "python"
    if dest.exists():
        shutil.rmtree(dest)
    what = " + ".join(requirements) if requirements else "numpy + onnxruntime-training-cpu"
    log.info("building the board venv at %s (%s)", dest, what)
    run_step([base_python(), "-m", "venv", str(dest)])
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
    if requirements is None:
        run_step([*pip, "-c", str(CONSTRAINTS), "-r", str(REQUIREMENTS)])
    else:
        run_step([*pip, "--only-binary=:all:", *requirements])
    make_readable(dest)
    stamp_file = dest / STAMP_NAME
    stamp_file.write_text(board_requirements_stamp(requirements) + "\n")
    os.chmod(stamp_file, 0o644)


def run_step(argv: list[str], what: str = "the board venv") -> str:
    """Run one build step; BoardError naming ``what``, the command and its output's tail on failure."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout)[-2000:].split())
        raise BoardError(f"building {what} failed ({' '.join(argv[:4])} ...): {tail}")
    return proc.stdout


def make_readable(root: Path) -> None:
    """chmod go+rX over the tree (dirs 0755, files keep their exec bit)."""
    for dirpath, _dirs, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            mode = os.stat(path).st_mode
            os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))
