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
