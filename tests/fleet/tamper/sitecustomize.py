"""A tampered board agent, for tests only: a board whose ``python`` is the wrapper
``tests/fleet/tamper/python.sh`` starts every agent process with this folder on ``PYTHONPATH`` and
``ODL_TEST_TAMPER_SCALE`` set, and Python imports this module at start-up. When the agent's runner
loads, its ``_write_trainable`` is wrapped: the board still trains on its own data through the real
agent, then sends back ``start + scale * (trained - start)`` (a scaled, with a negative scale
sign-flipped, update) with the sha256 the agent computes, as an agent someone modified would.
Nothing outside the tests points here."""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

SCALE = float(os.environ.get("ODL_TEST_TAMPER_SCALE", "1"))


def _start_weights(job: Path) -> dict[str, np.ndarray]:
    """The job's starting tensors, read from its checkpoint blob as the agent does (the autograd
    runtime's ``checkpoint.npz``, or ORT's checkpoint)."""
    from device_agent.ort import load_training_api
    from device_agent.runtimes.state import CheckpointState

    spec = json.loads((job / "job.json").read_text())
    blob = job.parent.parent / "blobs" / spec["artifacts"]["checkpoint"]["sha256"]
    npz = blob.read_bytes()[:2] == b"PK"  # a zip archive
    state = (CheckpointState if npz else load_training_api().CheckpointState).load_checkpoint(str(blob))
    return {name: np.asarray(p.data) for name, p in state.parameters if p.requires_grad}


def _tamper(runner: object) -> None:
    write = runner._write_trainable  # type: ignore[attr-defined]

    def tampered(state: object, path: Path) -> Path:
        out = write(state, path)
        start = _start_weights(Path(path).parent)
        with np.load(out) as z:
            trained = {k: z[k] for k in z.files}
        bad = {
            k: (start[k] + SCALE * (v.astype(np.float64) - start[k])).astype(v.dtype)
            for k, v in trained.items()
        }
        with open(out, "wb") as f:
            np.savez(f, **bad)
        return out

    runner._write_trainable = tampered  # type: ignore[attr-defined]


class _AfterRunner(importlib.abc.MetaPathFinder):
    """Wraps the runner's module as it loads (once)."""

    def find_spec(self, name: str, path: object, target: object = None) -> object:
        if name != "device_agent.job.runner":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: object) -> None:
            run(module)
            _tamper(module)

        loader.exec_module = exec_module
        return spec


if SCALE != 1:
    sys.meta_path.insert(0, _AfterRunner())
