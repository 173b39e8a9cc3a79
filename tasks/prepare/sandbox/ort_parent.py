"""The parent side of :mod:`tasks.prepare.sandbox.ort_child`: one child process that runs preparation's ONNX
graphs, started on the first request and again after it died, and the words for how it ended
(:func:`device_agent.signals.death`, shared with the board's agent). :mod:`tasks.prepare.sandbox.supervise` gives each preparation stage its child;
:mod:`tasks.prepare.sandbox.crash_site` bisects a graph that kills one.
"""

from __future__ import annotations

import contextlib
import pickle
import select
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from device_agent.signals import death
from tasks.exits import STOP_SIGNALS, Interrupted
from tasks.paths import PROJECT_ROOT
from tasks.prepare.sandbox.ort_child import HEADER, write_message

RUN_TIMEOUT_S = 600


class RunFailed(Exception):
    """ONNX Runtime refused the graph (``phase`` "load") or raised running it ("run"); the child lives on."""

    def __init__(self, phase: str, error: str) -> None:
        self.phase, self.error = phase, error
        super().__init__(error)


class Died(Exception):
    """The child ended while it ran a request (``returncode``: -signal, or its exit status)."""

    def __init__(self, returncode: int, stderr: str = "") -> None:
        self.returncode, self.stderr = returncode, stderr
        super().__init__(death(returncode))


def stop_if_interrupted(returncode: int) -> None:
    """Raise :class:`Interrupted` when a child was ended by a stop signal (the user stops ``odl``)."""
    if -returncode in STOP_SIGNALS:
        raise Interrupted(-returncode)


class Child:
    """One ``ort_child`` process (or another module serving the same framing), started on the first request and again after it died; one request
    at a time (threads sharing the process's child take turns)."""

    def __init__(self, *command: str) -> None:
        self.command = command or ("tasks.prepare.sandbox.ort_child",)  # ``python -m`` of these arguments
        self.proc: subprocess.Popen[bytes] | None = None
        self.errors: Any = None
        self.lock = threading.Lock()

    def ask(self, request: dict[str, Any], timeout: float = RUN_TIMEOUT_S) -> dict[str, Any]:
        """Send ``request`` and return the answer; :class:`Died` when the child ends first,
        TimeoutError (child killed) when it does not answer in ``timeout`` s."""
        with self.lock:
            return self._ask(request, timeout)

    def _ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            write_message(self.proc.stdin, request)
            return self._read(time.monotonic() + timeout)
        except (BrokenPipeError, EOFError):
            raise self._ended() from None
        except BaseException:  # a timeout or the user's Ctrl-C mid-request: the child is in an unknown state
            self.stop()
            raise

    def _start(self) -> None:
        self.errors = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", *self.command]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                     cwd=PROJECT_ROOT)  # fmt: skip

    def _read(self, deadline: float) -> dict[str, Any]:
        head = self._exactly(HEADER, deadline)
        return pickle.loads(self._exactly(int.from_bytes(head, "big"), deadline))

    def _exactly(self, size: int, deadline: float) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        out, fd = bytearray(), self.proc.stdout.fileno()
        while len(out) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = self.proc.stdout.read1(size - len(out))  # type: ignore[attr-defined]
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def _ended(self) -> Died:
        assert self.proc is not None
        code = self.proc.wait()
        self.errors.seek(0)
        text = self.errors.read().decode(errors="replace")
        self.proc = None
        stop_if_interrupted(code)
        return Died(code, text)

    def stop(self) -> None:
        """End the child (closing its stdin ends it; killed if it does not end at once)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
