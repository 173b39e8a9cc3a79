"""One function call of preparation in a fresh child process (``python -m tasks.prepare.child_call``),
for work that runs ONNX Runtime through libraries we do not drive graph by graph (the judge's
evaluation, the int8 quantizer): a death by signal there (SIGFPE, SIGSEGV, the OOM killer) kills the
child, and the caller gets one line naming the signal and what the call was doing, not a silent end
of ``odl`` with a ``.partial`` folder left behind.

The parent writes a length-prefixed pickle ``(target, args, torch_free)`` to the child's stdin, ``target`` being
``"module:function"``; the child answers ``{"ok": True, "value": ...}`` or ``{"ok": False, "error":
(module, class, text, attributes)}``, and an error raised in the child is raised again in the parent
as the same class (our errors carry their field and check as attributes, which plain pickling of an
exception loses). The child ignores SIGINT and SIGHUP, which reach the whole terminal's process
group: its parent stops it (a stop signal that ends the child stops ``odl`` like Ctrl-C).
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from tasks.errors import PipelineError
from tasks.paths import PROJECT_ROOT
from tasks.prepare.ort_child import read_message, write_message
from tasks.prepare.ort_parent import death, stop_if_interrupted

CALL_TIMEOUT_S = 1800


def call_in_child(
    target: str, *args: Any, what: str, error: Callable[[str], PipelineError], torch_free: bool = False,
    timeout: float = CALL_TIMEOUT_S,
) -> Any:  # fmt: skip
    """``target(*args)`` (``"module:function"``) run in a fresh child; its value, or its exception
    raised again here. ``torch_free``: the child blocks torch before it imports onnxruntime, as a
    board does (this host's onnxruntime-training imports torch with onnxruntime: 1.3 s of a 2.6 s
    call), so ``target`` must not need torch. When the child dies, ``error`` of one line: ``what`` died of the signal (or
    ended with its status, then with the last line it wrote to stderr); TimeoutError after ``timeout`` s."""
    path = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryFile() as errors, tempfile.TemporaryFile() as request:
        write_message(request, (target, args, torch_free))
        request.seek(0)
        proc = subprocess.run([sys.executable, "-m", "tasks.prepare.child_call"], stdin=request,
                              stdout=subprocess.PIPE, stderr=errors, timeout=timeout, check=False,
                              env={**os.environ, "PYTHONPATH": path})  # fmt: skip
        errors.seek(0)
        last = [line for line in errors.read().decode(errors="replace").splitlines() if line.strip()][-1:]
    if proc.returncode != 0 or not proc.stdout:
        stop_if_interrupted(proc.returncode)
        said = f" (its last words: {last[0].strip()[:200]})" if last and proc.returncode > 0 else ""
        ended = (
            f"died of {death(proc.returncode)}"
            if proc.returncode < 0
            else f"ended with {death(proc.returncode)}"
        )
        raise error(f"{what} {ended}{said}")
    reply = read_message(io.BytesIO(proc.stdout))
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


def main() -> int:
    """Serve the one call on stdin, answer on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    target, args, torch_free = read_message(sys.stdin.buffer)
    if torch_free:
        from device_agent.ort import load_onnxruntime  # only a torch-free call blocks torch

        load_onnxruntime()
    module, _, name = target.partition(":")
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a library's prints must not corrupt the answer
    try:
        value = getattr(importlib.import_module(module), name)(*args)
    except Exception as exc:  # noqa: BLE001 - every error goes back to the parent
        write_message(out, {"ok": False, "error": _described(exc)})
        return 0
    write_message(out, {"ok": True, "value": value})
    return 0


if __name__ == "__main__":
    sys.exit(main())
