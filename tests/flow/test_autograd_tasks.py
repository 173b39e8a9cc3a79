"""recipes/segmentation.toml and recipes/keypoints.toml under the autograd runtime (a recipe
override), through the whole odl flow on the local board: prepared without ORT's training graphs,
trained on the board by the plain-ONNX train step and judged on their own metric, which the
candidate raises over the base (mIoU, OKS AP). Two epochs each: the figures, not the promotion,
are what this checks (tests/flow/test_segmentation.py and test_keypoints.py gate the ORT runs).
The keypoints run sets ``pck_threshold = 0.2``: the board's eval PCK is the recipe's, not 0.1's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.flow.test_flow import _run

pytestmark = pytest.mark.slow
AUTOGRAD = {"training.runtime": "autograd", "training.epochs": 2}
CASES = [("segmentation", "miou", {}), ("keypoints", "oks_ap", {"keypoints.pck_threshold": 0.2})]


@pytest.mark.parametrize(("recipe", "metric", "more"), CASES, ids=[c[0] for c in CASES])
def test_task_trains_under_autograd_and_gains_its_metric(prefect_harness, flow_home, flow_board, recipe, metric,
                                                         more):  # fmt: skip
    from tasks.paths import PROJECT_ROOT

    path = PROJECT_ROOT / "recipes" / f"{recipe}.toml"
    _, out = _run(flow_board.name, recipe=str(path), overrides=AUTOGRAD | more)
    base, cand = out.metrics["base"], out.metrics["candidate"]
    print(f"{recipe} (autograd): {metric} {base[metric]:.4f} -> {cand[metric]:.4f}; loss {base['loss']:.4f} -> "
          f"{cand['loss']:.4f}; timings {out.timings}")  # fmt: skip
    assert cand[metric] > base[metric] and cand["loss"] < base["loss"]
    job = json.loads((Path(flow_board.root) / "jobs" / out.job_id / "job.json").read_text())
    assert job["runtime"] == "autograd" and "train_step" in job["artifacts"]  # the board ran the step graph
    history = json.loads((out.run_dir / "result.json").read_text())["history"]
    assert len(history) == 2 and 0 < history[-1]["eval_accuracy"] <= 1  # pixel accuracy, PCK
    if recipe == "keypoints":
        _assert_board_pck(path, out.run_dir / "inference.onnx", history[-1]["eval_accuracy"])


def _assert_board_pck(recipe_path: Path, model: Path, board_pck: float) -> None:
    """The board's last eval PCK is the trained model's at the recipe's threshold (0.2), not at 0.1."""
    from device_agent.keypoints import image_pck
    from tasks.judge.runtime import run_model
    from tasks.recipe.load import load_recipe

    with np.load(load_recipe(recipe_path).data.eval) as data:
        heatmaps, labels = run_model(model, data["x"])[0], data["y"]
    at = {t: image_pck(heatmaps, labels, (32, 32), t).mean() for t in (0.1, 0.2)}
    print(f"board eval PCK {board_pck:.4f}; host PCK at 0.1 {at[0.1]:.4f}, at 0.2 {at[0.2]:.4f}")
    assert board_pck == pytest.approx(at[0.2], abs=1e-6) and at[0.2] > at[0.1]
