"""The tensors a fleet moves: the trainable parameters of the prepared checkpoint, written into a
round's checkpoint, read back from a board's ``trainable.npz``, and turned into an inference model
for host evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.errors import FleetError
from tasks.hashing import file_sha256
from tasks.prepare import Prepared

Weights = dict[str, np.ndarray]


def trainable_weights(checkpoint: Path) -> Weights:
    """The trainable parameters of an ORT training checkpoint, by name."""
    from onnxruntime.training.api import CheckpointState

    state = CheckpointState.load_checkpoint(str(checkpoint))
    return {name: np.array(p.data) for name, p in state.parameters if p.requires_grad}


def write_checkpoint(base: Path, weights: Weights, out: Path) -> Path:
    """``out``: checkpoint ``base`` with its trainable parameters replaced by ``weights`` (frozen
    ones kept, no optimizer state); read back and compared, tensor by tensor."""
    from onnx import numpy_helper
    from onnxruntime.training.api import CheckpointState
    from onnxruntime.training.onnxblock.checkpoint_utils import save_checkpoint

    state = CheckpointState.load_checkpoint(str(base))
    trainable, frozen = [], []
    for name, p in state.parameters:
        have = np.array(p.data)
        if not p.requires_grad:
            frozen.append(numpy_helper.from_array(have, name))
            continue
        new = weights.get(name)
        if new is None or new.shape != have.shape or new.dtype != have.dtype:
            got = "absent" if new is None else f"{new.dtype}{list(new.shape)}"
            raise FleetError(
                f"trainable parameter {name!r} ({have.dtype}{list(have.shape)}) is {got} in the update"
            )
        trainable.append(numpy_helper.from_array(np.ascontiguousarray(new), name))
    extra = sorted(set(weights) - {t.name for t in trainable})
    if extra:
        raise FleetError(f"the update holds {extra[0]!r}, which is not a trainable parameter of the model")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    save_checkpoint((trainable, frozen), tmp)  # ORT's own writer (setting a loaded state crashes 1.19)
    tmp.replace(out)
    back = trainable_weights(out)
    if any(not np.array_equal(back[n], w) for n, w in weights.items()):
        out.unlink(missing_ok=True)
        raise FleetError(f"{out}: the written checkpoint does not hold the weights put in it")
    return out


def read_update(path: Path, reference: Weights, board: str) -> Weights:
    """A board's ``trainable.npz``, checked against the global model's names, shapes and dtypes and
    for non-finite values (a diverged board must not poison the aggregate)."""
    with np.load(path, allow_pickle=False) as z:
        got = {k: z[k] for k in z.files}
    if sorted(got) != sorted(reference):
        diff = sorted(set(got) ^ set(reference))
        raise FleetError(
            f"board {board}: trainable.npz tensors differ from the global model's (e.g. {diff[0]!r})"
        )
    for name, w in got.items():
        ref = reference[name]
        if w.shape != ref.shape or w.dtype != ref.dtype:
            raise FleetError(
                f"board {board}: tensor {name!r} is {w.dtype}{list(w.shape)}, expected {ref.dtype}{list(ref.shape)}"
            )
        if not np.isfinite(w).all():
            raise FleetError(f"board {board}: tensor {name!r} holds NaN or inf")
    return got


def inference_model(prep: Prepared, checkpoint: Path, out: Path) -> Path:
    """The inference model of ``checkpoint`` (exported as the board exports), cached by its hash."""
    from tasks.judge.evaluate import base_inference_model

    if out.is_file() and out.with_suffix(".src").is_file():
        if out.with_suffix(".src").read_text() == file_sha256(checkpoint):
            return out
    arts = prep.artifacts_dir
    base_inference_model(
        arts / "training_model.onnx",
        arts / "eval_model.onnx",
        checkpoint,
        prep.manifest["inference_output_names"],
        out,
    )
    out.with_suffix(".src").write_text(file_sha256(checkpoint))
    return out


def nbytes(weights: Weights) -> int:
    """The tensors' raw size in bytes."""
    return int(sum(w.nbytes for w in weights.values()))
