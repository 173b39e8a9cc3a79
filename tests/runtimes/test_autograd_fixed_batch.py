"""A step whose trace made its batch a constant is known right after the trace
(:func:`tasks.prepare.runtimes.autograd.steps.fixed_batch`), before any export."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tasks.prepare.runtimes.autograd.steps import fixed_batch


def test_a_symbolic_batch_is_not_fixed_and_a_specialised_one_is():
    x = torch.randn(3, 2)
    assert fixed_batch(make_fx(lambda t: t * 2, tracing_mode="symbolic")(x)) is None
    specialised = make_fx(lambda t: t * 2, tracing_mode="real")(x)  # every size a number
    assert fixed_batch(specialised) == 3
