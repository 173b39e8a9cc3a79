"""Load ONNX Runtime's training API without importing torch.

``onnxruntime/training/__init__.py`` imports torch (upstream bug #22070), which fails on a board
and costs ~3 s and ~500 MB where torch is installed. We register a bare ``onnxruntime.training``
package whose ``__path__`` points at the real folder, so ``onnxruntime.training.api`` imports
without running that ``__init__``; and we block ``torch`` unless it is already imported.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any


def _block_torch() -> None:
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise


def load_onnxruntime() -> Any:
    """Import onnxruntime with torch blocked; returns the module."""
    _block_torch()
    import onnxruntime  # lazy: after torch is blocked, and only for the commands that run ORT

    onnxruntime.set_default_logger_severity(3)
    return onnxruntime


def session_options(ort: Any) -> Any:
    """SessionOptions of the agent's sessions that run many batches (both runtimes' trainers, the
    frozen-prefix cache, the teacher's labelling): quiet, and ONNX Runtime's
    intra-op worker sleeps between operators instead of spinning.

    By default ORT pins one worker thread per physical core beyond the caller's (here: one, on CPU 1)
    and spins it; on a 2-core board that runs anything else, a step then waits whole scheduler slices
    for the spinning thread, and the speed of a process depends on where its threads landed. Measured
    on the digits bench job (ORT 1.19.2, 600-1000 steps, default and no-spin runs interleaved, load
    13-18 on 2 cores): 925-1539 samples/s spinning (median step 7-34 ms) against 2473-5077 without
    (median step 1.8-4.1 ms), every pair; the unimpeded step (10th percentile) is 1.6-2.1 ms in both.
    The autograd train step of digits alone in an InferenceSession: 1079-1738 against 1834-11434.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def load_training_api() -> Any:
    """Return ``onnxruntime.training.api`` without importing torch.

    Raises ImportError (with the reason) when this onnxruntime has no training API.
    """
    ort = load_onnxruntime()
    name = "onnxruntime.training"
    existing = sys.modules.get(name)
    if existing is None:
        folder = os.path.join(os.path.dirname(ort.__file__), "training")
        if not os.path.isdir(os.path.join(folder, "api")):
            raise ImportError(f"onnxruntime {ort.__version__} has no training API ({folder}/api missing)")
        pkg = types.ModuleType(name)
        pkg.__path__ = [folder]  # type: ignore[attr-defined]
        pkg.__package__ = name
        sys.modules[name] = pkg
        ort.training = pkg  # type: ignore[attr-defined]
    api = importlib.import_module("onnxruntime.training.api")
    if not hasattr(api, "CheckpointState"):
        raise ImportError("onnxruntime.training.api has no CheckpointState")
    return api


def training_api_status() -> tuple[bool, str]:
    """(True, "") when the training API loads, else (False, reason)."""
    try:
        load_training_api()
        from onnxruntime.capi import _pybind_state as capi  # lazy: loaded by load_training_api above

        if not hasattr(capi, "load_checkpoint"):
            return False, "onnxruntime build without training (plain onnxruntime installed?)"
    except Exception as exc:  # noqa: BLE001 - report any failure verbatim
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def seed_runtime(seed: int) -> None:
    """Seed ORT's random generators (dropout masks) when this build exposes ``set_seed``."""
    from onnxruntime.capi import _pybind_state as capi  # lazy: ORT is loaded on demand (see above)

    setter = getattr(capi, "set_seed", None)
    if setter is not None:
        setter(int(seed) & 0x7FFFFFFF)
