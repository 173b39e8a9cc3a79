"""Models and data of the token and sequence recipes (recipes/tokens.toml, recipes/sequence.toml):
each model is pretrained on this host on one domain, and the board fine-tunes it on a shifted one.

- ``tokens``: a bag-of-tokens intent classifier (int64 token ids -> Embedding -> GRU -> mean ->
  Linear). Each of 4 intents is said with its own keywords among filler words; the host's users say
  them with one set of keywords, the board's users with another (synonyms the pretraining never
  saw). The board trains the GRU and the classifier (``last-conv+classifier``: the last recurrent
  layer counts as the last layer), the embedding stays frozen.
- ``activity``: human activity recognition from a 3-axis accelerometer ([N, 3, 64]: still, walking,
  running, jumping) with a Conv1d + GRU model. The host's data comes from a device worn upright,
  the board's from the same device mounted another way (axes swapped and signs flipped, another
  gravity axis, more sensor noise); the board trains the GRU and the classifier on its own data.

Pretraining is small (seconds on one core) and seeded; each data make writes ``base_weights.pt``,
``train.npz`` (400 samples of the board's domain and 200 replayed pretraining samples),
``test.npz`` (300 of the board's domain) and ``host_test.npz`` (200 held-out samples of the host's
domain: the forgetting check).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, LENGTH, INTENTS = 48, 16, 4
KEYWORDS = {"host": np.arange(0, 8).reshape(INTENTS, 2), "board": np.arange(8, 16).reshape(INTENTS, 2)}
FILLER = np.arange(16, VOCAB)
ACTIVITIES, STEPS, RATE_HZ = 4, 64, 25.0


class TokenGRU(nn.Module):
    """Token ids [N, L] -> Embedding -> GRU -> mean over the sequence -> Linear."""

    def __init__(
        self, num_classes: int = INTENTS, vocab: int = VOCAB, dim: int = 16, hidden: int = 32
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, hidden, batch_first=True)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.gru(self.embedding(ids))[0].mean(1))


class ActivityNet(nn.Module):
    """Accelerometer windows [N, 3, T] -> Conv1d + ReLU + max-pool -> GRU -> last step -> Linear."""

    def __init__(self, num_classes: int = ACTIVITIES, channels: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, channels, 5, padding=2)
        self.gru = nn.GRU(channels, hidden, batch_first=True)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool1d(F.relu(self.conv(x)), 2).transpose(1, 2)
        return self.classifier(self.gru(h)[0][:, -1])


def token_gru(num_classes: int = INTENTS) -> nn.Module:
    return TokenGRU(num_classes)


def activity_net(num_classes: int = ACTIVITIES) -> nn.Module:
    return ActivityNet(num_classes)


def utterances(rng: np.random.Generator, n: int, domain: str) -> tuple[np.ndarray, np.ndarray]:
    """``n`` utterances of LENGTH token ids: filler words with 2 or 3 of the intent's keywords of
    ``domain`` (host or board) at random places; labels are the intents."""
    y = rng.integers(0, INTENTS, n)
    x = rng.choice(FILLER, (n, LENGTH))
    for i, intent in enumerate(y):
        places = rng.choice(LENGTH, rng.integers(2, 4), replace=False)
        x[i, places] = rng.choice(KEYWORDS[domain][intent], len(places))
    return x.astype(np.int64), y.astype(np.int64)


def windows(rng: np.random.Generator, n: int, domain: str) -> tuple[np.ndarray, np.ndarray]:
    """``n`` accelerometer windows [3, STEPS] at RATE_HZ: still (noise), walking (~1.8 Hz), running
    (~2.8 Hz, stronger), jumping (a landing spike about once a second), in g. The host's device is
    upright (gravity and motion on z); the board's is mounted on its side (gravity on x, the motion
    axis flipped onto x and y) with twice the noise."""
    t = np.arange(STEPS) / RATE_HZ
    y = rng.integers(0, ACTIVITIES, n)
    x = np.zeros((n, 3, STEPS))
    for i, activity in enumerate(y):
        phase, wobble = rng.uniform(0, 2 * np.pi), rng.uniform(0.1, 0.3)
        if activity == 1:
            motion = 0.6 * np.sin(2 * np.pi * rng.uniform(1.5, 2.1) * t + phase)
        elif activity == 2:
            motion = 1.5 * np.sin(2 * np.pi * rng.uniform(2.5, 3.2) * t + phase)
        elif activity == 3:
            motion = np.zeros(STEPS)
            for start in range(int(rng.integers(0, 20)), STEPS, int(rng.integers(22, 28))):
                motion[start : start + 3] += 2.5
        else:
            motion = np.zeros(STEPS)
        x[i, 2] = 1.0 + motion
        x[i, 0] = wobble * motion
        x[i, 1] = wobble * np.sin(2 * np.pi * 0.5 * t + phase) * (activity > 0)
    noise = 0.05 if domain == "host" else 0.1
    if domain == "board":
        x = np.stack([x[:, 2], -x[:, 0], x[:, 1]], axis=1)
    x += rng.normal(0, noise, x.shape)
    return x.astype(np.float32), y.astype(np.int64)


def _write(out_dir: Path, make, model_class: type[nn.Module], *, target: float, lr: float, what: str) -> None:
    """Pretrain ``model`` on 600 host samples until it classifies 200 other host samples (held out,
    used by no test) at ``target`` (recipes/targets.py: Adam with a decaying rate, 12 to 30 epochs),
    save it and what it reached (``.fit.json``), and write the board's sets and 200 held-out host
    samples. A fixed number of epochs at a constant rate left a base model that differed with the
    CPU's float rounding (``ATEN_CPU_CAPABILITY=default``: a sequence base whose fine-tuning forgot
    its upright windows beyond the gate's tolerance)."""
    from targets import Target, fit_classifier  # recipes/targets.py: the recipe folder is on the path

    out_dir = Path(out_dir)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    host_x, host_y = make(rng, 800, "host")
    heldout = make(np.random.default_rng(1), 200, "host")  # its own draw: the other sets stay as they were
    torch.manual_seed(0)  # the same initial weights in every process
    model = model_class()
    goal = Target(f"the {what}", "accuracy on 200 held-out host samples", target, 30, 12)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models: torch's spinning threads only slow a busy machine down
    try:
        fit = fit_classifier(model, lambda _: (host_x[:600], host_y[:600]), heldout, goal, lr=lr, decay=0.85,
                             batch=32, seed=0)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    torch.save(model.state_dict(), out_dir / "base_weights.pt")
    fit.save(out_dir / "base_weights.pt")
    board_x, board_y = make(rng, 700, "board")
    replay = slice(0, 200)  # pretraining samples the board keeps training on (with 100, PyTorch's
    # fine-tuning of the activity model at lr 3e-3 drops its upright accuracy from 1.00 to 0.77)
    np.savez(out_dir / "train.npz", x=np.concatenate([board_x[:400], host_x[replay]]),
             y=np.concatenate([board_y[:400], host_y[replay]]))  # fmt: skip
    np.savez(out_dir / "test.npz", x=board_x[400:], y=board_y[400:])
    np.savez(out_dir / "host_test.npz", x=host_x[600:], y=host_y[600:])
    print(f"  {fit.line()} ({time.perf_counter() - start:.1f} s)", flush=True)


def tokens_shifted(out_dir: Path) -> None:
    """The token recipe's data: intents said with the host's keywords (pretraining) and the board's."""
    _write(out_dir, utterances, TokenGRU, target=0.95, lr=3e-3, what="token GRU")  # settles at 0.97


def activity_shifted(out_dir: Path) -> None:
    """The sequence recipe's data: activities from an upright device (pretraining) and a sideways one."""
    _write(out_dir, windows, ActivityNet, target=0.98, lr=3e-3, what="activity Conv1d + GRU")  # at 1.00
