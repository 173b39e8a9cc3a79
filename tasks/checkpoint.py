"""Parameters in and out of ORT training checkpoints, on the host: read them by name, and write a
checkpoint that is a prepared one with some of its parameters replaced (a warm start replaces
them all, a fleet round the trainable ones), read back and compared tensor by tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.errors import ArtifactError

Weights = dict[str, np.ndarray]


def checkpoint_weights(checkpoint: Path, *, trainable_only: bool = False) -> Weights:
    """The parameters of an ORT training checkpoint by name (only the trainable ones if asked)."""
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
    from onnx import numpy_helper  # onnx only to write a checkpoint
    from onnxruntime.training.api import (
        CheckpointState,  # ORT training (loads torch) only to touch a checkpoint
    )
    from onnxruntime.training.onnxblock.checkpoint_utils import (
        save_checkpoint,  # ORT training (loads torch) only to touch a checkpoint
    )

    state = CheckpointState.load_checkpoint(str(base))
    split: tuple[list, list] = ([], [])  # (trainable, frozen) as the base checkpoint has them
    replaced = set()
    for name, p in state.parameters:
        arr = np.array(p.data)
        if p.requires_grad or every:
            new = weights.get(name)
            if new is None or new.shape != arr.shape or new.dtype != arr.dtype:
                got = "absent" if new is None else f"{new.dtype}{list(new.shape)}"
                raise ArtifactError(
                    f"parameter {name!r} ({arr.dtype}{list(arr.shape)}) is {got} in the new weights"
                )
            arr = np.ascontiguousarray(new)
            replaced.add(name)
        split[0 if p.requires_grad else 1].append(numpy_helper.from_array(arr, name))
    extra = sorted(set(weights) - replaced)
    if extra:
        raise ArtifactError(f"the new weights hold {extra[0]!r}, which {base} does not let them replace")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    save_checkpoint(split, tmp)  # ORT's own writer (setting a loaded state's parameters crashes 1.19)
    tmp.replace(out)
    back = checkpoint_weights(out)
    if any(not np.array_equal(back[n], w) for n, w in weights.items()):
        out.unlink(missing_ok=True)
        raise ArtifactError(f"{out}: the written checkpoint does not hold the weights put in it")
    return out
