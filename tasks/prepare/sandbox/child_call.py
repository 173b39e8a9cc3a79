"""Function calls of preparation in a child process (``python -m tasks.prepare.sandbox.child_call``), for
work that runs ONNX Runtime through libraries we do not drive graph by graph (the judge's
evaluation, the int8 quantizer): a death by signal there (SIGFPE, SIGSEGV, the OOM killer) kills the
child, and the caller gets one line naming the signal and what the call was doing, not a silent end
of ``odl`` with a ``.partial`` folder left behind.

One child serves the calls of a process, started on the first and again after one killed it, so a call costs what its work costs, not an interpreter's start (0.65 s
for the digits rehearsal in a fresh child, 0.05 s in a warm one). Each request is a length-prefixed
pickle ``{"target": "module:function", "args": [...], "cwd": folder}`` (the caller's working
folder, so relative paths mean the same); the answer ``{"ok": True, "value": ...}`` or ``{"ok":
False, "error": (module, class, text, attributes)}``, raised again in the parent as the same class
(our errors carry their field and check as attributes, which plain pickling of an exception loses).
The child ignores SIGINT and SIGHUP, which reach the whole terminal's process group: its parent
stops it (a stop signal that ends the child stops ``odl`` like Ctrl-C).
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.errors import PipelineError
from tasks.exits import no_collection_at_exit
from tasks.prepare.sandbox.ort_child import read_message, write_message
from tasks.prepare.sandbox.ort_parent import Child, Died, death

CALL_TIMEOUT_S = 1800
_CHILD = Child("tasks.prepare.sandbox.child_call")
atexit.register(_CHILD.stop)


def call_in_child(
    target: str, *args: Any, what: str, error: Callable[[str], PipelineError], timeout: float = CALL_TIMEOUT_S
) -> Any:
    """``target(*args)`` (``"module:function"``) run in the process's call child; its value, or its
    exception raised again here. When the child dies, ``error`` of one line: ``what`` died of
    the signal (or ended with its status, then with the last line it wrote to stderr);
    TimeoutError (child killed) after ``timeout`` s."""
    request = {"target": target, "args": args, "cwd": os.getcwd()}
    try:
        reply = _CHILD.ask(request, timeout)
    except Died as died:
        last = [line for line in died.stderr.splitlines() if line.strip()][-1:]
        said = f" (its last words: {last[0].strip()[:200]})" if last and died.returncode > 0 else ""
        ended = (
            f"died of {death(died.returncode)}"
            if died.returncode < 0
            else f"ended with {death(died.returncode)}"
        )
        raise error(f"{what} {ended}{said}") from None
    if reply["ok"]:
        return reply["value"]
    raise _rebuilt(*reply["error"])


def _rebuilt(module: str, name: str, text: str, attrs: dict[str, Any]) -> BaseException:
    """The exception the child raised, as its own class where that can be imported (RuntimeError
    naming the class otherwise), with its message and attributes."""
    try:
        cls = getattr(importlib.import_module(module), name)
        exc = cls.__new__(cls)
        Exception.__init__(exc, text)
        exc.__dict__.update(attrs)
        return exc
    except Exception:  # noqa: BLE001 - any class we cannot rebuild is named in a RuntimeError
        return RuntimeError(f"{name}: {text}")


def _described(exc: BaseException) -> tuple[str, str, str, dict[str, Any]]:
    attrs = {k: v for k, v in vars(exc).items() if _picklable(v)}
    return type(exc).__module__, type(exc).__qualname__, str(exc), attrs


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - an attribute that does not pickle stays behind
        return False
    return True


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    os.chdir(request["cwd"])
    module, _, name = request["target"].partition(":")
    try:
        return {"ok": True, "value": getattr(importlib.import_module(module), name)(*request["args"])}
    except Exception as exc:  # noqa: BLE001 - every error goes back to the parent
        return {"ok": False, "error": _described(exc)}


def main() -> int:
    """Serve the calls on stdin until it closes, each answered on stdout."""
    no_collection_at_exit()  # its parent waits for it to end
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project, whatever the folder
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a library's prints must not corrupt the answers
    while (request := read_message(sys.stdin.buffer)) is not None:
        write_message(out, _answer(request))
    return 0


if __name__ == "__main__":
    sys.exit(main())
