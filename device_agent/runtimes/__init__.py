"""How a job's trainer steps, behind one interface: ``onnxruntime.training.api``'s shape.

* ``ort-training`` (:mod:`device_agent.runtimes.ort_training`): ONNX Runtime's training API itself,
  over ONNX Runtime's training, eval and optimizer graphs;
* ``autograd`` (:mod:`device_agent.runtimes.autograd`): a plain ONNX train step run by
  ``onnxruntime.InferenceSession`` and a numpy optimizer; it never imports ``onnxruntime.training``.

:func:`open_runtime` loads a job's state, module and optimizer with the runtime its spec names, and
the seeder the trainer calls before each step when a step draws random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device_agent.errors import AgentError
from device_agent.ort import load_onnxruntime, session_options
from device_agent.protocol import ExitCode
from device_agent.runtimes.autograd import AutogradApi
from device_agent.runtimes.ort_training import step_seeder, training_api

# the artifacts each runtime's Module and Optimizer load: (train graph, eval graph, optimizer)
GRAPHS = {
    "ort-training": ("training_model", "eval_model", "optimizer_model"),
    "autograd": ("train_step", "eval_step", "step"),
}


@dataclass
class Opened:
    """A job's runtime objects: the api, its state, module and optimizer, the eval graph (the
    inputs' shapes and dtypes are read from it: its path, or the bytes of the autograd runtime's
    eval step with the tensors it leaves out) and the per-step seeder (None: nothing random)."""

    api: Any
    state: Any
    module: Any
    optimizer: Any
    eval_graph: Path | bytes
    seeder: Any


def checkpoint_state(runtime: str) -> Any:
    """The ``CheckpointState`` class that reads a ``runtime`` job's checkpoints."""
    return AutogradApi.CheckpointState if runtime == "autograd" else training_api().CheckpointState


def open_runtime(runtime: str, paths: dict[str, Path], checkpoint: Path) -> Opened:
    """Load ``checkpoint`` and the job's graphs (``paths`` by artifact key) with ``runtime``;
    ARTIFACT_INVALID when they do not load, NO_TRAINING_API for an ORT job on a board without it."""
    train, evaluate, optim = GRAPHS[runtime]
    api = None if runtime == "autograd" else training_api()
    try:
        api = api or AutogradApi(paths["step"], paths["inference_template"], paths)
        state = api.CheckpointState.load_checkpoint(str(checkpoint))
        options = {} if runtime == "autograd" else {"session_options": session_options(load_onnxruntime())}
        module = api.Module(str(paths[train]), state, str(paths[evaluate]), **options)
        optimizer = api.Optimizer(str(paths[optim]), module)
    except Exception as exc:  # noqa: BLE001 - ORT raises RuntimeError, Fail, InvalidArgument...
        raise AgentError(ExitCode.ARTIFACT_INVALID, f"artifacts do not load in ONNX Runtime: {exc}") from exc
    if runtime == "autograd":
        seeder = module.seed if module.random else None
        eval_graph = api.graph(paths[evaluate], evaluate)
    else:
        seeder, eval_graph = step_seeder(paths[train]), paths[evaluate]
    return Opened(api, state, module, optimizer, Path(eval_graph) if isinstance(eval_graph, str) else eval_graph,
                  seeder)  # fmt: skip
