"""The autograd runtime on the board: the train step is a plain ONNX graph, run by
``onnxruntime.InferenceSession``; the optimizer is numpy. No ``onnxruntime.training`` anywhere, so a
board with the plain ``onnxruntime`` wheel (any version that loads opset 20) trains with it.

:class:`AutogradApi` is duck-typed on ``onnxruntime.training.api``, the way the trainer and the
runner use it: ``CheckpointState`` (load/save, ``parameters``, ``properties``), ``Module(train, state,
eval)`` (called on a batch it returns the loss and the model's outputs and keeps the gradients;
``train()``/``eval()``, ``input_names()``, ``output_names()``, ``lazy_reset_grad()``,
``export_model_for_inferencing(path, outputs)``) and ``Optimizer(step.json, module)``. What the files
are is in ``step.json`` (``tasks.prepare.runtimes.autograd.build``); the tensors the eval step and
the inference template leave out, held once by another artifact or the state, are appended as each
is loaded (:mod:`device_agent.runtimes.weights`). A step's random draws are inputs:
:meth:`Module.seed` makes them a function of the seed the trainer gives each step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.ort import load_onnxruntime, session_options
from device_agent.runtimes.state import CheckpointState, Optimizer
from device_agent.runtimes.weights import assembled, graph_source, left_out, shared_files

NAME = "autograd"


class Module:
    """The train and eval step sessions over a :class:`CheckpointState`."""

    def __init__(self, train_step: str, state: CheckpointState, eval_step: str, spec: dict[str, Any],
                 template: str, files: dict[str, Any]) -> None:  # fmt: skip
        self.state, self.spec, self.template, self.files = state, spec, template, files
        self._paths = {True: train_step, False: eval_step}
        self._sessions: dict[bool, Any] = {}
        self._feeds = [f["name"] for f in spec["feeds"]]
        self._trainable = [t["name"] for t in spec["trainable"]]
        missing = [n for n in self._trainable if n not in state.parameters]
        if missing:
            raise ValueError(f"the checkpoint has no tensor {missing[0]!r} that step.json trains")
        self._outputs = list(spec["outputs"])
        self._grads: dict[str, np.ndarray] | None = None
        self._reset = True
        self._rng = np.random.default_rng(0)
        self.training = True
        self._session(True)  # load errors surface when the job opens, as ORT's Module does

    def _session(self, training: bool) -> Any:
        if training not in self._sessions:
            ort = load_onnxruntime()
            options = session_options(ort)
            # step.json's choice (tasks.prepare.runtimes.autograd.build.session_settings)
            options.enable_mem_pattern = bool(self.spec.get("session", {}).get("memory_pattern", True))
            key = "train_step" if training else "eval_step"
            self._sessions[training] = ort.InferenceSession(
                graph_source(self._paths[training], key, self.spec, self.files), options,
                providers=["CPUExecutionProvider"],
            )  # fmt: skip
        return self._sessions[training]

    @property
    def random(self) -> bool:
        """Whether a step draws random numbers (then the trainer seeds every step)."""
        return bool(self.spec.get("noise") or self.spec.get("eval_noise"))

    def seed(self, value: int) -> None:
        """Make the next steps' random draws a function of ``value``."""
        self._rng = np.random.default_rng(int(value))

    def _noise(self, batch: int) -> dict[str, np.ndarray]:
        inputs = self.spec["noise"] if self.training else self.spec.get("eval_noise", [])
        return {
            n["name"]: self._rng.random([batch if d == "batch" else d for d in n["shape"]], dtype=np.float32)
            for n in inputs
        }

    def __call__(self, *batch: np.ndarray) -> Any:
        feeds = dict(zip(self._feeds, batch, strict=True))
        feeds |= {n: self.state.parameters[n].data for n in self._trainable}
        feeds |= self._noise(len(batch[0]))
        names = self._outputs + (self.spec["gradients"] if self.training else [])
        values = self._session(self.training).run(names, feeds)
        outs = values[: len(self._outputs)]
        if self.training:
            grads = dict(zip(self._trainable, values[len(self._outputs) :], strict=True))
            if self._reset or self._grads is None:
                self._grads = grads
            else:  # gradients accumulate until lazy_reset_grad, as ORT's do
                self._grads = {n: self._grads[n] + g for n, g in grads.items()}
            self._reset = False
        return outs[0] if len(outs) == 1 else tuple(outs)

    def gradients(self) -> dict[str, np.ndarray]:
        """The gradients of the trainable tensors since the last reset."""
        if self._grads is None:
            raise RuntimeError("no gradients: run a training step first")
        return self._grads

    def lazy_reset_grad(self) -> None:
        """The next training step starts the gradients afresh."""
        self._reset = True

    def train(self, mode: bool = True) -> Module:
        """Training mode (the train step) or, with ``mode=False``, eval mode."""
        self.training = mode
        return self

    def eval(self) -> Module:
        """Eval mode: the eval step, no gradients."""
        return self.train(False)

    def input_names(self) -> list[str]:
        """The feeds a batch gives, in order."""
        return list(self._feeds)

    def output_names(self) -> list[str]:
        """The outputs a call returns: the loss, then the model's."""
        return list(self._outputs)

    def export_model_for_inferencing(self, path: str, output_names: list[str]) -> None:
        """Write the inference model with the state's tensors: the template with the tensors it
        leaves out appended (the trainable ones from the state, the frozen ones from the artifacts
        that hold them)."""
        inference = self.spec["inference"]
        if list(output_names) != list(inference["outputs"]):
            raise ValueError(
                f"the inference template has outputs {inference['outputs']}, not {list(output_names)}"
            )
        state = {name: p.data for name, p in self.state.parameters}
        tmp = f"{path}.part"
        Path(tmp).write_bytes(
            assembled(self.template, left_out(self.spec, "inference_template"), self.files, state)
        )
        os.replace(tmp, path)


class AutogradApi:
    """``onnxruntime.training.api``'s shape for the autograd runtime of one prepared step."""

    CheckpointState = CheckpointState

    def __init__(
        self, step_json: str | Path, template: str | Path, files: dict[str, Any] | None = None
    ) -> None:
        """``files``: the job's artifacts by key (the board's blobs), which the tensors a file leaves
        out are read from; by default the files beside ``step_json`` that it names (a prepared folder)."""
        self.spec = json.loads(Path(step_json).read_text())
        if self.spec.get("runtime") != NAME:
            raise ValueError(f"{step_json} describes runtime {self.spec.get('runtime')!r}, not {NAME!r}")
        self.template = str(template)
        self.files = dict(files) if files is not None else shared_files(step_json, self.spec)

    def Module(self, train_step: str, state: CheckpointState, eval_step: str) -> Module:  # noqa: N802 - ORT's name
        """The step sessions over ``state``."""
        return Module(train_step, state, eval_step, self.spec, self.template, self.files)

    def graph(self, path: str | Path, key: str) -> str | bytes:
        """What a session of the step file ``key`` (``train_step``, ``eval_step``) at ``path`` loads."""
        return graph_source(path, key, self.spec, self.files)

    def Optimizer(self, step_json: str, module: Module) -> Optimizer:  # noqa: N802 - ORT's name
        """The optimizer ``step_json`` names, over ``module``'s gradients."""
        return Optimizer(json.loads(Path(step_json).read_text())["optimizer"], module)
