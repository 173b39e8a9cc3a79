"""The autograd runtime's training state and optimizer, in numpy: what ``onnxruntime.training.api``'s
``CheckpointState`` and ``Optimizer`` are to the ORT runtime.

A checkpoint is one ``.npz`` file: ``param/<name>`` (the trainable tensors), ``opt/step``,
``opt/m/<name>`` and ``opt/v/<name>`` (AdamW's moments, or SGD's momentum buffer in ``m``, with
the optimizer state), ``properties`` (the trainer's progress, as JSON). It is written to a temporary
name, fsync'd and renamed.

The optimizers are ONNX Runtime's, to the float32 operation (``tests/runtimes`` compares them with
its optimizer graphs): SGD ``w -= lr * g``; AdamW (``AdamWOptimizer``, mode 1, bias correction):
``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g g``, ``w -= lr_t * m / (sqrt(v) + eps)`` with
``lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)``, then ``w -= lr * wd * w`` on the updated weight. SGD with
``momentum`` (which ONNX Runtime's SGD lacks) is ``torch.optim.SGD``'s, dampening 0: ``m = g`` at
the first step, then ``m = mu m + g``; ``w -= lr * m``, or ``w -= lr * (g + mu m)`` with ``nesterov``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.atomic import atomic_savez

F32 = np.float32


class Parameter:
    """One tensor of the state: its values (``data``), and whether it trains (always, here)."""

    def __init__(self, name: str, data: np.ndarray, requires_grad: bool = True) -> None:
        self.name, self.data, self.requires_grad = name, data, requires_grad

    def __repr__(self) -> str:
        return f"Parameter(name={self.name}, requires_grad={self.requires_grad})"


class Parameters:
    """The state's tensors by name; iterating gives ``(name, Parameter)`` as ORT's does."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self._by_name = {n: Parameter(n, np.array(t, dtype=F32)) for n, t in tensors.items()}

    def __getitem__(self, name: str) -> Parameter:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[tuple[str, Parameter]]:
        return iter(self._by_name.items())

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> list[str]:
        """The tensors' names in the checkpoint's order."""
        return list(self._by_name)


class CheckpointState:
    """The trainable tensors, the optimizer's state (``step``, moments) and ``properties``."""

    def __init__(self, tensors: dict[str, np.ndarray], optimizer: dict[str, Any] | None = None,
                 properties: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.parameters = Parameters(tensors)
        self.optimizer: dict[str, Any] = optimizer or {"step": 0, "m": {}, "v": {}}
        self.properties: dict[str, Any] = properties or {}

    @classmethod
    def load_checkpoint(cls, path: str | os.PathLike[str]) -> CheckpointState:
        """Read a checkpoint written by :meth:`save_checkpoint` (or the prepared ``checkpoint.npz``,
        which holds the tensors only)."""
        with np.load(path, allow_pickle=False) as npz:
            keys = list(npz.files)
            tensors = {k.removeprefix("param/"): npz[k] for k in keys if k.startswith("param/")}
            if not tensors:  # the prepared checkpoint: name -> tensor
                tensors = {k: npz[k] for k in keys}
                return cls(tensors)
            optimizer = {
                "step": int(npz["opt/step"]) if "opt/step" in keys else 0,
                "m": {k.removeprefix("opt/m/"): npz[k].astype(F32) for k in keys if k.startswith("opt/m/")},
                "v": {k.removeprefix("opt/v/"): npz[k].astype(F32) for k in keys if k.startswith("opt/v/")},
            }
            properties = json.loads(str(npz["properties"])) if "properties" in keys else {}
        return cls(tensors, optimizer, properties)

    @staticmethod
    def save_checkpoint(
        state: CheckpointState, path: str | os.PathLike[str], include_optimizer_state: bool = True
    ) -> None:
        """Write ``state`` to ``path`` atomically (tmp + fsync + rename)."""
        arrays: dict[str, Any] = {f"param/{n}": p.data for n, p in state.parameters}
        if include_optimizer_state:
            arrays["opt/step"] = np.int64(state.optimizer["step"])
            arrays |= {f"opt/m/{n}": m for n, m in state.optimizer["m"].items()}
            arrays |= {f"opt/v/{n}": v for n, v in state.optimizer["v"].items()}
        arrays["properties"] = np.array(json.dumps(dict(state.properties)))
        atomic_savez(Path(path), arrays)


class Optimizer:
    """AdamW or SGD over a module's gradients, as the step's ``optimizer`` section says."""

    def __init__(self, spec: dict[str, Any], module: Any) -> None:
        self.spec, self.module = spec, module
        self.lr = F32(spec["lr"])

    def set_learning_rate(self, lr: float) -> None:
        """The rate of the next steps."""
        self.lr = F32(lr)

    def step(self) -> None:
        """Update every trainable tensor of the module's state from its last gradients."""
        state, grads = self.module.state, self.module.gradients()
        opt = state.optimizer
        opt["step"] += 1
        for name, grad in grads.items():
            param = state.parameters[name]
            if self.spec["kind"] == "sgd":
                param.data = param.data - self.lr * self._momentum(name, grad, opt)
            else:
                param.data = self._adamw(name, param.data, grad, opt)

    def _momentum(self, name: str, g: np.ndarray, opt: dict[str, Any]) -> np.ndarray:
        """SGD's direction: the gradient, or torch.optim.SGD's momentum buffer (Nesterov's look-ahead)."""
        mu = F32(self.spec.get("momentum", 0.0))
        if mu == 0:
            return g
        buf = opt["m"].get(name)
        buf = g.copy() if buf is None else mu * buf + g
        opt["m"][name] = buf
        return g + mu * buf if self.spec.get("nesterov", False) else buf

    def _adamw(self, name: str, w: np.ndarray, g: np.ndarray, opt: dict[str, Any]) -> np.ndarray:
        b1, b2 = (F32(b) for b in self.spec["betas"])
        eps, wd, one, t = F32(self.spec["eps"]), F32(self.spec["weight_decay"]), F32(1), F32(opt["step"])
        m = opt["m"].get(name, np.zeros_like(w))
        v = opt["v"].get(name, np.zeros_like(w))
        m = b1 * m + (one - b1) * g
        v = b2 * v + (one - b2) * (g * g)
        opt["m"][name], opt["v"][name] = m, v
        lr_t = self.lr * np.sqrt(one - b2**t) / (one - b1**t)
        w = w - lr_t * m / (np.sqrt(v) + eps)
        return w - self.lr * wd * w if wd > 0 else w
