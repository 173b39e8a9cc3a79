"""BatchNorm statistics measured on the recipe's own data before export (``[trainable]
batchnorm_calibration = N``).

On-board training normalises with the running statistics the exported model holds
(``trainable.batchnorm = "frozen"``, the default). A backbone from random init, or one whose data
has shifted since it was trained, holds statistics that do not fit the board's data: its features
collapse or saturate and the trainable head cannot move (a DS-CNN from random init: features of std
4e-4, accuracy 0.09 -> 0.13 on the board while PyTorch trains the same data to 1.0). When the
recipe's model is built (:func:`tasks.prepare.export.torch_model.build_model`, so the export, validation's
comparison with PyTorch and the autograd runtime all see the same model), :func:`calibrated`
re-measures every BatchNorm's running mean and variance on up to N samples of ``data.train``: each
BatchNorm's statistics are reset and accumulated as a cumulative average (``momentum = None``)
over forward passes of up to 64 samples with the BatchNorm layers alone in training mode (Dropout and everything else in
eval mode) and no gradients; no weight changes. The module's momentum and training flags are
restored afterwards; the measured statistics stay in the model that is exported.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import RecipeError
from tasks.recipe.datafiles import load_arrays
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
FIELD = "trainable.batchnorm_calibration"
POSITIONAL = ("x", "y")
BATCH = 64  # rows per forward pass: averaging many small batches' variances underestimates the spread
# between them, which compounds through a deep random-init network  # the npz keys of the model's first and second inputs without [data].feeds


def _batchnorms(module: Any) -> list[tuple[str, Any]]:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    return [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def calibration_inputs(recipe: Recipe, samples: int) -> list[np.ndarray]:
    """Up to ``samples`` rows of ``data.train`` for each model input (through ``[data].feeds``, else
    ``x`` and ``y`` by position); RecipeError naming the field without a training file on the host."""
    path = recipe.data.train
    if path is None or not Path(path).is_file():
        raise RecipeError(
            FIELD, "a data.train file on the host to measure BatchNorm statistics on", str(path)
        )
    arrays = load_arrays(path)
    out = []
    for k, name in enumerate(recipe.model.input_names):
        key = recipe.data.feeds.get(name, POSITIONAL[k] if k < len(POSITIONAL) else name)
        if key not in arrays:
            raise RecipeError(
                FIELD, f"an array '{key}' for model input '{name}' in {Path(path).name}", sorted(arrays)
            )
        out.append(np.ascontiguousarray(arrays[key][:samples]))
    return out


def batches(n: int, size: int) -> list[slice]:
    """Slices of ``n`` rows in batches of ``size``, a last batch of one row joined to the one before
    (a BatchNorm in training mode needs more than one value per channel)."""
    starts = list(range(0, n, size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, [*starts[1:], n], strict=True)]


def measure(module: Any, inputs: list[np.ndarray], batch: int) -> int:
    """Reset and re-measure every BatchNorm's running statistics of ``module`` over ``inputs`` in
    batches of ``batch`` (cumulative average; only BatchNorm layers in training mode, no gradients);
    momentum and training flags are restored. Returns the number of BatchNorm layers."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    norms = _batchnorms(module)
    flags = {id(m): m.training for m in module.modules()}
    momenta = {id(m): m.momentum for _, m in norms}
    try:
        module.eval()
        for _, m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the batches
            m.train()
        with torch.no_grad():
            for rows in batches(len(inputs[0]), batch):
                module(*(torch.from_numpy(a[rows]) for a in inputs))
    finally:
        for m in module.modules():
            m.training = flags[id(m)]
        for _, m in norms:
            m.momentum = momenta[id(m)]
    return len(norms)


def calibrated(recipe: Recipe, module: Any) -> Any:
    """``module`` with its BatchNorm statistics measured on the recipe's training data when the
    recipe asks for it (``trainable.batchnorm_calibration`` > 0); RecipeError naming the field for a
    model without BatchNorm layers or without host training data."""
    samples = recipe.trainable.batchnorm_calibration
    if not samples:
        return module
    if not _batchnorms(module):
        raise RecipeError(FIELD, "a model with BatchNorm layers to measure (this one has none)", samples)
    inputs = calibration_inputs(recipe, samples)
    if len(inputs[0]) < 2:
        raise RecipeError(
            FIELD, "at least 2 samples in data.train to measure BatchNorm statistics on", len(inputs[0])
        )
    start = time.perf_counter()
    layers = measure(module, inputs, BATCH)
    log.info(
        "BatchNorm statistics of %d layers measured on %d samples of data.train (%.1f s)",
        layers,
        len(inputs[0]),
        time.perf_counter() - start,
    )
    return module
