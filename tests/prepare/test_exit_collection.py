"""A process of ``odl`` (and each of preparation's children) frees what it holds at exit without
the interpreter's garbage-collector passes over it (:func:`tasks.exits.no_collection_at_exit`),
after every atexit handler registered later; a file it writes is whole and nothing is printed."""

from __future__ import annotations

import subprocess
import sys

from tasks.paths import PROJECT_ROOT

PROGRAM = """
import atexit, gc, sys
import torch.distributed  # its deprecated reduce_op warns when asked its __class__
atexit.register(lambda: print("frozen" if gc.get_freeze_count() else "not frozen", flush=True))  # runs last
from tasks.exits import no_collection_at_exit
no_collection_at_exit()
no_collection_at_exit()
atexit.register(lambda: print("later handler ran before:", gc.get_freeze_count() == 0, flush=True))
cycle = {"file": open(sys.argv[1], "w")}
cycle["self"] = cycle  # a reference cycle holding an open file with buffered text
cycle["file"].write("written")
"""


def test_exit_freezes_after_later_handlers_and_files_written_are_whole(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "f.txt")], capture_output=True,
                         text=True, cwd=PROJECT_ROOT, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["later handler ran before: True", "frozen"]
    assert (tmp_path / "f.txt").read_text() == "written"  # its cycle is never collected: flushed before
    assert "Warning" not in out.stderr, out.stderr


def test_the_odl_command_and_the_children_use_it():
    for module in ("flows/cli/__init__.py", "tasks/prepare/sandbox/ort_child.py",
                   "tasks/prepare/sandbox/child_call.py"):  # fmt: skip
        assert "no_collection_at_exit()" in (PROJECT_ROOT / module).read_text(), module
