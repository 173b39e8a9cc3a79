"""Random layers train in the autograd runtime as PyTorch trains them, whatever draws them (Dropout,
Dropout2d, torchvision's StochasticDepth, a hand-written mask): each draw is a noise input of the
train step, the masks it makes equal PyTorch's for the same uniform numbers, the eval step draws
nothing, and the board's draws are a function of (seed, step)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnxruntime
import pytest
import torch

from tasks.prepare.board_job import build_job_spec
from tests.runtimes.kit import assert_step_equals, prepared_module, torch_model

P2D, SURVIVE, OWN, P = 0.3, 0.6, 0.2, 0.5
MODULE = f"""
import torch
from torch import nn
from torchvision.ops import StochasticDepth


class RandomNet(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.drop2d = nn.Dropout2d({P2D})
        self.depth = StochasticDepth({1 - SURVIVE}, "row")
        self.drop = nn.Dropout({P})
        self.head = nn.Linear(4 * 16, num_classes)

    def forward(self, x):
        y = self.drop2d(torch.relu(self.conv(x)))
        y = y + self.depth(y)
        if self.training:  # a hand-written mask, drawn by the model's own forward
            y = y * (torch.rand(x.shape[0], 1, 1, 1) > {OWN})
        return self.head(self.drop(torch.flatten(y, 1)))


def random_net(num_classes=3):
    return RandomNet(num_classes)
"""


@pytest.fixture(scope="module")
def random_prepared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("random")
    return prepared_module(folder, "randomnet", MODULE, {"model": {"callable": "randomnet:random_net"}})


@pytest.fixture(scope="module")
def random_traced(tmp_path_factory):
    """The same model with its steps traced by ``make_fx`` (as one the graph path cannot take)."""
    from tasks.prepare.runtimes.autograd import steps

    def refuse(*args, **kwargs):
        raise steps.Unsupported("this test traces the steps")

    folder = tmp_path_factory.mktemp("random-traced")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(steps, "graph_step", refuse)
        return prepared_module(folder, "randomnet", MODULE, {"model": {"callable": "randomnet:random_net"}})


def _reference(recipe, weights, x, y, noise, kept_below):
    """Loss and gradients by PyTorch with the masks the noise stands for, as each layer draws them
    (``kept_below``: the exported graph's dropout keeps u < 1 - p; the traced one, PyTorch's own
    decomposition, keeps u > p)."""
    model = torch_model(recipe, weights)
    drop2d, depth, own, drop = (torch.from_numpy(n) for n in noise)
    h = torch.relu(model.conv(torch.from_numpy(x)))
    h = h * (drop2d < 1 - P2D) / (1 - P2D)  # Dropout2d: a Bernoulli(1 - p) per channel
    h = h + h * (depth < SURVIVE) / SURVIVE  # StochasticDepth "row": a Bernoulli(survival) per sample
    h = h * (own > OWN)  # torch.rand(...) > 0.2
    flat = torch.flatten(h, 1)
    kept = drop < 1 - P if kept_below else drop > P
    logits = model.head(flat * kept / (1 - P))  # Dropout: a Bernoulli(1 - p) per element
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()
    return loss.item(), {n: p.grad.numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("path", ["graph", "traced"])
def test_each_random_draw_is_a_noise_input_of_the_train_step(request, path):
    recipe, prepared = request.getfixturevalue("random_prepared" if path == "graph" else "random_traced")
    step = json.loads((prepared.artifacts_dir / "step.json").read_text())
    shapes = [n["shape"] for n in step["noise"]]
    assert shapes == [["batch", 4, 1, 1], ["batch", 1, 1, 1], ["batch", 1, 1, 1], ["batch", 64]]
    assert step["eval_noise"] == []
    session = onnxruntime.InferenceSession(str(prepared.artifacts_dir / "train_step.onnx"))
    with np.load(prepared.artifacts_dir / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    data = np.load(recipe.data.train)
    x, y = data["x"][:5], data["y"][:5].astype(np.int64)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        noise = [rng.random([5 if d == "batch" else d for d in s], dtype=np.float32) for s in shapes]
        feeds = {
            "input": x,
            "labels": y,
            **weights,
            **{n["name"]: a for n, a in zip(step["noise"], noise, strict=True)},
        }
        got = session.run(None, feeds)
        assert_step_equals(got, step["trainable"], *_reference(recipe, weights, x, y, noise, path == "graph"))


def test_the_board_draws_from_the_seed_and_the_step(agent_board, random_prepared):
    recipe, prepared = random_prepared

    def losses(job_id, seed):
        spec, files = build_job_spec(recipe, prepared, job_id)
        spec = replace(spec, train=replace(spec.train, seed=seed, log_every=1, epochs=2))
        jdir = agent_board.install(spec, files)
        run = agent_board.run("run", str(jdir))
        assert run.code == 0, run.err[-2000:]
        events = [json.loads(line) for line in (jdir / "events.jsonl").read_text().splitlines()]
        return [e["data"]["loss"] for e in events if e["type"] == "step"]

    first, again, other = losses("a", 0), losses("b", 0), losses("c", 1)
    assert first == again and len(first) == 24
    assert first != other
