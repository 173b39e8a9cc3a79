"""The host pretraining of the reference keypoints model: :func:`unet.unet` with one output channel
per keypoint, trained as a heatmap model (the same MSE against Gaussian targets as the recipe's
training graph, :mod:`tasks.prepare.losses.keypoints`) until its OKS AP on held-out data reaches its
target (:mod:`targets`: epoch by epoch, Adam with a decaying rate, at most MAX_EPOCHS)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from device_agent.keypoints import decode
from tasks.judge.keypoints import coco_keypoints_eval, keypoint_records, oks_aps
from tasks.prepare.losses.keypoints import gaussian_targets
from tasks.recipe.keypoints import DEFAULT_SIGMA

MAX_EPOCHS = 40
MIN_EPOCHS = 4


def heldout_ap(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """OKS AP (pycocotools, every keypoint's sigma DEFAULT_SIGMA) of ``model``'s heatmaps on ``(x, y)``."""
    with torch.no_grad():
        out = torch.cat([model(torch.from_numpy(x[i : i + 128])) for i in range(0, len(x), 128)]).numpy()
    pred, peak = decode(out, tuple(x.shape[-2:]))
    ev = coco_keypoints_eval(pred, peak.mean(axis=1), y, (DEFAULT_SIGMA,) * y.shape[1])
    return oks_aps(keypoint_records(ev))["oks_ap"]


def pretrain_heatmaps(train: tuple[np.ndarray, np.ndarray], heldout: tuple[np.ndarray, np.ndarray], out: Path,
                      keypoints: int, target: float, sigma: float = 2.0, lr: float = 3e-3,
                      batch: int = 32) -> object:  # fmt: skip
    """Train the heatmap U-Net on ``train`` until its OKS AP on ``heldout`` reaches ``target``; save its
    state_dict to ``out`` (and the fit beside it) and return the :class:`targets.Fit`."""
    from models import free_cores  # recipes/models.py: the recipe folder is on the path
    from targets import Target, train_to_target
    from unet import unet

    threads = torch.get_num_threads()
    torch.set_num_threads(free_cores(threads))
    try:
        model = unet(keypoints)
        x = torch.from_numpy(train[0])
        heat, weight = (torch.from_numpy(a.astype(np.float32)) for a in gaussian_targets(
            train[1], tuple(train[0].shape[-2:]), tuple(train[0].shape[-2:]), sigma))  # fmt: skip
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        schedule = torch.optim.lr_scheduler.ExponentialLR(opt, 0.93)
        gen = torch.Generator().manual_seed(0)

        def epoch(_: int) -> None:
            for idx in torch.randperm(len(x), generator=gen).split(batch):
                opt.zero_grad()
                (((model(x[idx]) - heat[idx]) ** 2) * weight[idx]).mean().backward()
                opt.step()
            schedule.step()

        what = Target("the heatmap U-Net", f"OKS AP on {len(heldout[0])} held-out studio figures", target,
                      MAX_EPOCHS, MIN_EPOCHS)  # fmt: skip
        fit = train_to_target(model, epoch, lambda: heldout_ap(model, *heldout), what)
    finally:
        torch.set_num_threads(threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    fit.save(out)
    return fit
