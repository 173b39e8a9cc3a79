"""Helpers of the runtimes tests: a recipe prepared by ``odl prepare`` in a process tree, an agent
job run to its end, what it logged and what it trained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from device_agent.job.events import read_events
from tasks.paths import PROJECT_ROOT
from tasks.prepare.pipeline import prepare
from tests.prepare.kit import merge, tiny_recipe


def odl(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m flows.cli ARGS`` (the ``odl`` command) with ``env`` added to this one's."""
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env={**os.environ, **env}, timeout=timeout)  # fmt: skip


def prepared_by_odl(recipe_file: Path, overrides: dict[str, str], out: Path, env: dict[str, str]):
    """``odl prepare RECIPE --set K=V ... --out OUT`` in a child with ``env``: (Recipe, Prepared)."""
    from tasks.prepare import Prepared
    from tasks.recipe.load import load_recipe, parse_override

    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    proc = odl(["prepare", str(recipe_file), *sets, "--out", str(out)], env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    validation = json.loads((out / "validation.json").read_text())
    recipe = load_recipe(recipe_file, dict(parse_override(f"{k}={v}") for k, v in overrides.items()))
    return recipe, Prepared.of(out, manifest, validation)


def run_job(agent_board, spec, files, env=None) -> tuple[Path, dict]:
    """Install and run a job to its end on ``agent_board``: its folder and result."""
    jdir = agent_board.install(spec, files)
    run = agent_board.run("run", str(jdir), env=env)
    assert run.code == 0, run.err[-3000:]
    return jdir, run.last


def step_losses(jdir: Path) -> list[float]:
    """The loss of every step event of a job."""
    return [e["data"]["loss"] for e in read_events(jdir / "events.jsonl") if e["type"] == "step"]


def trained(jdir: Path) -> dict[str, np.ndarray]:
    """A finished job's trained tensors (``trainable.npz``)."""
    with np.load(jdir / "trainable.npz") as npz:
        return dict(npz)


def assert_trained_alike(got: Path, want: Path, steps: int) -> None:
    """Two finished jobs trained alike: ``steps`` step losses each, equal within 1e-4 (relative),
    and the same trained tensors, equal within 1e-4."""
    losses, ort_losses = np.array(step_losses(got)), np.array(step_losses(want))
    assert len(losses) == len(ort_losses) == steps
    np.testing.assert_allclose(losses, ort_losses, rtol=1e-4)
    weights, ort_weights = trained(got), trained(want)
    assert weights.keys() == ort_weights.keys()
    for name, w in ort_weights.items():
        np.testing.assert_allclose(weights[name], w, rtol=0, atol=1e-4, err_msg=name)


def prepared_module(folder: Path, module: str, source: str, changes: dict):
    """``source`` written as ``folder/MODULE.py`` and the tiny recipe with ``changes`` prepared under
    the autograd runtime, every tensor trainable, batch 8: (Recipe, Prepared)."""
    (folder / f"{module}.py").write_text(source)
    base = {"trainable": {"strategy": "all"}, "training": {"runtime": "autograd", "batch_size": 8}}
    recipe = tiny_recipe(folder, merge(base, changes))
    return recipe, prepare(recipe, folder / "out")


def assert_step_equals(got: list[np.ndarray], trainable: list[dict], loss: float, grads: dict) -> None:
    """A train step's results (loss, one output, then the gradients of ``trainable`` as step.json
    lists them) equal PyTorch's ``loss`` and ``grads`` within 1e-5 (relative to the largest value)."""
    assert abs(got[0] - loss) <= 1e-5 * max(1, abs(loss))
    for spec, grad in zip(trainable, got[2:], strict=True):
        want = grads[spec["name"]]
        assert np.abs(grad - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), spec["name"]


def torch_model(recipe, weights: dict[str, np.ndarray]):
    """The recipe's PyTorch model with ``weights`` (a prepared checkpoint's tensors) loaded."""
    import torch  # torch (heavy) only where a test compares with PyTorch

    from tasks.prepare.export.torch_model import build_model  # imports torch too

    model = build_model(recipe)
    model.load_state_dict({n: torch.from_numpy(w) for n, w in weights.items()})
    return model


def assert_trains_like_pytorch(recipe, prepared, session=None) -> None:
    """The prepared train step (run by ``session``, an ONNX Runtime session of it by default) gives
    PyTorch's cross-entropy loss and gradients on 5 samples of the recipe's data, with the
    checkpoint's weights (:func:`assert_step_equals`)."""
    import onnxruntime  # the board's inference API, as the agent runs the step
    import torch  # torch (heavy) only where a test compares with PyTorch

    art = prepared.artifacts_dir
    step = json.loads((art / "step.json").read_text())
    session = session or onnxruntime.InferenceSession(str(art / "train_step.onnx"))
    with np.load(art / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    data = np.load(recipe.data.train)
    x, y = data["x"][:5], data["y"][:5].astype(np.int64)
    model = torch_model(recipe, weights)
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    got = session.run(None, {"input": x, "labels": y, **weights})
    assert_step_equals(got, step["trainable"], loss.item(), grads)
