"""A training step's learning rate, a function of the step number alone, so a resumed job
reproduces an uninterrupted one (a step's random draws are its runtime's:
:func:`device_agent.runtimes.ort_training.step_seeder`, :mod:`device_agent.runtimes.autograd`)."""

from __future__ import annotations

from device_agent.protocol import TrainParams


def lr_at(step: int, total: int, p: TrainParams) -> float:
    """Linear warm-up to ``p.lr`` over ``warmup_steps``, then linear decay to ``lr*final_lr_ratio``."""
    if step < p.warmup_steps:
        return p.lr * (step + 1) / p.warmup_steps
    span = max(1, total - p.warmup_steps - 1)
    frac = min(1.0, (step - p.warmup_steps) / span)
    return p.lr * (1.0 - frac * (1.0 - p.final_lr_ratio))
