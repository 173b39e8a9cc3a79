"""The child that runs preparation's ONNX graphs (``python -m tasks.prepare.sandbox.ort_child``), so a graph
that kills ONNX Runtime (SIGFPE, SIGSEGV, the OOM killer) kills this process and not ``odl``.

It serves requests until its stdin closes: each a length-prefixed pickle ``{"model": bytes or
path, "feeds": {name: array} or None, "outputs": [names] or None, "shapes_only": bool}``, each
answered with ``{"ok": True, "inputs": [(name, shape, type)], "outputs": [names], "values": [arrays,
or (shape, dtype) pairs; None for an output ONNX Runtime gives back unset: a Range of constants
it folded] or None}`` or ``{"ok": False, "phase": "load" | "run", "error": text}``. Like the training probe it imports only
the standard library, numpy and onnxruntime (torch blocked by
:func:`device_agent.ort.load_onnxruntime`; the parent imports this module for its framing). It
ignores SIGINT and SIGHUP, which reach the whole terminal's process group: its parent stops it.
Parent side: :mod:`tasks.prepare.sandbox.supervise`.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import signal
import sys
from typing import Any, BinaryIO

from device_agent.ort import load_onnxruntime  # blocks torch before onnxruntime loads, like a board
from tasks.exits import no_collection_at_exit
from tasks.quiet import ORT_CAUGHT

HEADER = 8  # bytes of the big-endian length before each pickle


def read_message(stream: BinaryIO) -> Any | None:
    """The next length-prefixed pickle of ``stream``; None at its end."""
    head = stream.read(HEADER)
    if len(head) < HEADER:
        return None
    return pickle.loads(stream.read(int.from_bytes(head, "big")))


def write_message(stream: BinaryIO, message: Any) -> None:
    """Write ``message`` as a length-prefixed pickle and flush."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(len(payload).to_bytes(HEADER, "big") + payload)
    stream.flush()


class Sessions:
    """The last model's session, kept while the same model is asked for again (a teacher's batches)."""

    def __init__(self) -> None:
        self.ort = load_onnxruntime()
        self.key: str | None = None
        self.session: Any = None

    def of(self, model: bytes | str) -> Any:
        """The session of ``model`` (serialized bytes, or a file: rewritten, it loads again)."""
        key = _file_key(model) if isinstance(model, str) else hashlib.sha1(model).hexdigest()
        if key != self.key:
            self.session, self.key = None, None
            options = self.ort.SessionOptions()
            options.log_severity_level = ORT_CAUGHT
            self.session = self.ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            self.key = key
        return self.session


def _file_key(path: str) -> str:
    try:
        stat = os.stat(path)
    except OSError:
        return path  # the session's own error names it
    return f"{path}:{stat.st_mtime_ns}:{stat.st_size}"


def answer(sessions: Sessions, request: dict[str, Any]) -> dict[str, Any]:
    """Run one request: load (or reuse) the session, run it when feeds are given."""
    try:
        session = sessions.of(request["model"])
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which words it
        return {"ok": False, "phase": "load", "error": str(exc) or type(exc).__name__}
    inputs = [(i.name, list(i.shape), i.type) for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    values = None
    if request.get("feeds") is not None:
        try:
            values = session.run(request.get("outputs"), request["feeds"])
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "phase": "run", "error": str(exc) or type(exc).__name__}
        if request.get("shapes_only"):  # what a shape probe needs, without sending every tensor back
            values = [None if v is None else (list(v.shape), v.dtype.str) for v in values]
    return {"ok": True, "inputs": inputs, "outputs": outputs, "values": values}


def main() -> int:
    """Serve requests from stdin until it closes."""
    no_collection_at_exit()  # its parent waits for it to end
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sessions = Sessions()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (request := read_message(stdin)) is not None:
        write_message(stdout, answer(sessions, request))
    return 0


if __name__ == "__main__":
    sys.exit(main())
