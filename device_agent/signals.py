"""How a process ended, in words: ``SIGFPE (an arithmetic fault: ...)`` for a signal, ``exit status
N`` otherwise. The agent says so of a job's training process that died, the host of preparation's
ONNX Runtime children (``tasks.prepare.sandbox.ort_parent``)."""

from __future__ import annotations

import signal

MEANING = {
    "SIGFPE": "an arithmetic fault: an integer division or remainder by zero",
    "SIGSEGV": "an invalid memory access",
    "SIGBUS": "a bus error",
    "SIGABRT": "an abort: a failed internal check",
    "SIGILL": "an illegal instruction: a CPU feature this machine lacks",
    "SIGKILL": "killed, most likely by the kernel's out-of-memory killer",
}


def death(returncode: int, meaning: dict[str, str] | None = None) -> str:
    """How a process ended (``returncode``: -signal, or its exit status); ``meaning`` overrides
    some signals' words."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
    words = {**MEANING, **(meaning or {})}
    return f"{name} ({words[name]})" if name in words else name
