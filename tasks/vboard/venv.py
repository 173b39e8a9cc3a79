"""The board's Python environment: a venv with only numpy and onnxruntime-training-cpu.

Used by tests and by the virtual board to run the device agent torch-free, exactly as on a
STM32MP2 board. Built once per content of ``deploy/board-requirements.txt`` (a stamp file).
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

log = logging.getLogger(__name__)

REQUIREMENTS = PROJECT_ROOT / "deploy" / "board-requirements.txt"
CONSTRAINTS = PROJECT_ROOT / "constraints.txt"
STAMP_NAME = ".odl-board-env"
# A system interpreter (as on a board) is readable by every user; pyenv's under /root is not.
SYSTEM_PYTHONS = ("/usr/bin/python3.11", "/usr/bin/python3")


def board_requirements_stamp() -> str:
    """A hash of the board requirements and constraints: the venv is rebuilt when it changes."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(CONSTRAINTS.read_bytes())
    return digest.hexdigest()


def base_python() -> str:
    """The interpreter the board venv is built from: a system Python 3 if present, else ours."""
    for cand in SYSTEM_PYTHONS:
        if os.access(cand, os.X_OK):
            return cand
    return sys.executable


def ensure_board_venv(dest: Path) -> Path:
    """Create (idempotently) a venv at ``dest`` with only numpy + onnxruntime-training-cpu.

    Returns the venv's python path. A second call with unchanged requirements returns at once.
    Directories are made 0755 so another Linux user (the virtual board's) can run it.
    """
    dest = Path(dest)
    python = dest / "bin" / "python"
    if _is_current(dest):
        return python
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent builders (two pytest runs) wait for one
        if not _is_current(dest):
            _build(dest)
    return python


def _is_current(dest: Path) -> bool:
    stamp_file = dest / STAMP_NAME
    return (
        (dest / "bin" / "python").exists()
        and stamp_file.exists()
        and (stamp_file.read_text().strip() == board_requirements_stamp())
    )


def _build(dest: Path) -> None:
    python = dest / "bin" / "python"
    if dest.exists():
        shutil.rmtree(dest)
    log.info("building the board venv at %s (numpy + onnxruntime-training-cpu)", dest)
    _run([base_python(), "-m", "venv", str(dest)])
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
    _run([*pip, "-c", str(CONSTRAINTS), "-r", str(REQUIREMENTS)])
    _make_readable(dest)
    stamp_file = dest / STAMP_NAME
    stamp_file.write_text(board_requirements_stamp() + "\n")
    os.chmod(stamp_file, 0o644)


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise BoardError(f"building the board venv failed ({' '.join(argv[:4])} ...): {tail}")


def _make_readable(root: Path) -> None:
    """chmod go+rX over the tree (dirs 0755, files keep their exec bit)."""
    for dirpath, _dirs, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            mode = os.stat(path).st_mode
            os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))
