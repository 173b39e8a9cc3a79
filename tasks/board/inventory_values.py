"""The values of an inventory entry: each key's check and conversion, and their TOML spelling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from device_agent.protocol import RUNTIME_ARTIFACTS
from tasks.errors import BoardError

# The training runtimes (a job spec's ``runtime``): "ort-training" needs ONNX Runtime's training API
# (onnxruntime-training); "autograd" runs a train step as a plain ONNX graph with any InferenceSession.
RUNTIMES = tuple(RUNTIME_ARTIFACTS)


def convert(where: str, key: str, val: Any) -> Any:
    if key == "port":
        if isinstance(val, bool) or not isinstance(val, int) or not 0 < val < 65536:
            raise BoardError(f"{where}: key 'port': expected an integer in 1..65535 (got {val!r})")
        return val
    if key in ("connect_timeout", "pull_deadline_h"):
        if isinstance(val, bool) or not isinstance(val, int | float) or val <= 0:
            unit = "hours" if key == "pull_deadline_h" else "seconds"
            raise BoardError(f"{where}: key '{key}': expected {unit} > 0 (got {val!r})")
        return float(val)
    if key == "runtimes":
        if not isinstance(val, list) or not val or any(v not in RUNTIMES for v in val):
            raise BoardError(f"{where}: key 'runtimes': expected a non-empty list of {', '.join(map(repr, RUNTIMES))} "
                             f"(got {val!r})")  # fmt: skip
        return tuple(val)
    if not isinstance(val, str) or not val:
        raise BoardError(f"{where}: key '{key}': expected a non-empty string (got {val!r})")
    if key in ("key", "known_hosts"):
        return Path(val).expanduser()
    return val


def toml_value(val: Any) -> str:
    if isinstance(val, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in val) + "]"
    if isinstance(val, bool):
        return "true" if val else "false"
    if isinstance(val, int | float):
        return repr(val)
    text = str(val).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
