"""torch's ONNX exporter as the step export runs it: its conversion registry built once per
process, with :mod:`.recurrent_onnx`'s translations, and its decomposition pass left out: the
caller runs that pass itself, with its own decompositions in the same table, only when the program
holds an operator it rewrites (:func:`.onnx_step.rewrites_with`).

Measured on a small convolutional model (``odl prepare``, 2-core host): reading torchlib's
conversions costs 0.25-0.5 s each time the exporter is called, and its decomposition pass,
``decompose_with_registry``, re-traces the whole step (0.7-1 s) even when it has nothing to rewrite.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from tasks.prepare.runtimes.autograd.recurrent_onnx import translations


@functools.cache
def registry() -> Any:
    """The exporter's conversions (torchlib's and :func:`.recurrent_onnx.translations`)."""
    from torch.onnx._internal.exporter import _registration  # the exporter's registry, pinned with torch

    built = _registration.ONNXRegistry.from_torchlib()
    for op, convert in translations().items():
        built.register_op(op, convert, is_complex=False)
    return built


@functools.cache
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """The decompositions the exporter applies before converting: PyTorch's own, for each operator
    it has no conversion for (``squeeze.dims`` among them)."""
    from torch.onnx._internal.exporter import _decomp  # the exporter's table, pinned with torch

    return _decomp.create_onnx_friendly_decomposition_table(
        set(_decomp.get_onnx_implemented_overloads(registry()))
    )


@contextlib.contextmanager
def _prepared_exporter() -> Iterator[None]:
    from torch.onnx._internal.exporter import _fx_passes, _registration  # patched for one export

    saved = _registration.ONNXRegistry.from_torchlib, _fx_passes.decompose_with_registry
    _registration.ONNXRegistry.from_torchlib = classmethod(lambda cls, *args, **kwargs: registry())
    _fx_passes.decompose_with_registry = lambda program, _registry: program
    try:
        yield
    finally:
        _registration.ONNXRegistry.from_torchlib, _fx_passes.decompose_with_registry = saved


def export(program: Any, args: tuple[Any, ...], **options: Any) -> Any:
    """``torch.onnx.export(program, args, dynamo=True, **options)`` with :func:`registry`, without
    the exporter's decomposition pass: ``program`` must hold none of :func:`decomposition_table`'s
    operators (decompose it with that table first when it does)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    with _prepared_exporter():
        return torch.onnx.export(program, args, dynamo=True, verbose=False, **options)
