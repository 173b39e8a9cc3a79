"""Parameters in and out of training checkpoints, on the host (ORT's, or the autograd runtime's
npz): read them by name, and write a checkpoint that is a prepared one with some of its parameters
replaced (a warm start replaces them all, a fleet round the trainable ones), read back and compared
tensor by tensor."""

from __future__ import annotations

import os
import threading
import zipfile
from pathlib import Path

import numpy as np

from device_agent.runtimes.state import CheckpointState as AutogradState
from tasks.errors import ArtifactError

Weights = dict[str, np.ndarray]


def autograd_checkpoint(path: Path) -> bool:
    """Whether ``path`` is an autograd runtime's checkpoint (an npz: a zip file); ORT's are not."""
    return zipfile.is_zipfile(path)


def checkpoint_weights(checkpoint: Path, *, trainable_only: bool = False) -> Weights:
    """The parameters of a training checkpoint by name (only the trainable ones if asked): ORT's, or
    the autograd runtime's (whose tensors all train)."""
    if autograd_checkpoint(checkpoint):
        return {name: np.array(p.data) for name, p in AutogradState.load_checkpoint(checkpoint).parameters}
    from onnxruntime.training.api import (
        CheckpointState,  # ORT training (loads torch) only to touch a checkpoint
    )

    state = CheckpointState.load_checkpoint(str(checkpoint))
    return {name: np.array(p.data) for name, p in state.parameters if p.requires_grad or not trainable_only}


def write_checkpoint(base: Path, weights: Weights, out: Path, *, every: bool = False) -> Path:
    """``out``: checkpoint ``base`` with its trainable parameters (``every``: all of them) replaced
    by ``weights``, the others kept, no optimizer state. ``weights`` must hold exactly those
    parameters with their shapes and dtypes (callers check first and word their own errors; this
    is the last guard, an ArtifactError)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # a name of this process and thread: a fleet's board tasks write the same suffix checkpoint at once
    tmp = out.with_name(f"{out.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    if autograd_checkpoint(base):
        state = AutogradState.load_checkpoint(base)
        tensors = _replaced([(n, np.array(p.data), True) for n, p in state.parameters], weights, base, every)
        AutogradState.save_checkpoint(AutogradState(dict(tensors[0])), tmp, include_optimizer_state=False)
    else:
        _write_ort(base, weights, tmp, every)
    tmp.replace(out)
    back = checkpoint_weights(out)
    if any(not np.array_equal(back[n], w) for n, w in weights.items()):
        out.unlink(missing_ok=True)
        raise ArtifactError(f"{out}: the written checkpoint does not hold the weights put in it")
    return out


def _replaced(params: list[tuple[str, np.ndarray, bool]], weights: Weights, base: Path,
              every: bool) -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]:  # fmt: skip
    """(trainable, frozen) ``(name, array)`` of ``params`` (name, values, trainable) with the trainable
    ones (``every``: all) taken from ``weights``, each of the same shape and dtype, and no other."""
    split: tuple[list, list] = ([], [])
    replaced = set()
    for name, arr, trains in params:
        if trains or every:
            new = weights.get(name)
            if new is None or new.shape != arr.shape or new.dtype != arr.dtype:
                got = "absent" if new is None else f"{new.dtype}{list(new.shape)}"
                raise ArtifactError(
                    f"parameter {name!r} ({arr.dtype}{list(arr.shape)}) is {got} in the new weights"
                )
            arr = np.ascontiguousarray(new)
            replaced.add(name)
        split[0 if trains else 1].append((name, arr))
    extra = sorted(set(weights) - replaced)
    if extra:
        raise ArtifactError(f"the new weights hold {extra[0]!r}, which {base} does not let them replace")
    return split


def _write_ort(base: Path, weights: Weights, out: Path, every: bool) -> None:
    """An ORT checkpoint: ``base``'s with the parameters :func:`_replaced` takes from ``weights``."""
    from onnx import numpy_helper  # onnx only to write a checkpoint
    from onnxruntime.training.api import (
        CheckpointState,  # ORT training (loads torch) only to touch a checkpoint
    )
    from onnxruntime.training.onnxblock.checkpoint_utils import (
        save_checkpoint,  # ORT training (loads torch) only to touch a checkpoint
    )

    state = CheckpointState.load_checkpoint(str(base))
    params = [(n, np.array(p.data), p.requires_grad) for n, p in state.parameters]
    trainable, frozen = _replaced(params, weights, base, every)
    split = (
        [numpy_helper.from_array(a, n) for n, a in trainable],
        [numpy_helper.from_array(a, n) for n, a in frozen],
    )
    save_checkpoint(split, out)  # ORT's own writer (setting a loaded state's parameters crashes 1.19)
