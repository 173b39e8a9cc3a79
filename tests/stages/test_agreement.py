"""Frozen BatchNorm: what the board measures is what the retrieved model computes on the host, and
the graph the board trains is the model it exports (the gap ORT's batch statistics leave)."""

from __future__ import annotations

import pytest

from tasks.paths import PROJECT_ROOT


@pytest.mark.slow
def test_frozen_batchnorm_board_and_host_agree(flow_home, flow_board, tmp_path):
    from tasks.stages.agreement import board_vs_host

    rows = {
        mode: board_vs_host(
            PROJECT_ROOT / "recipes" / "digits.toml",
            flow_board.name,
            tmp_path / mode,
            {"training.epochs": 1, "trainable.batchnorm": mode},
        )  # fmt: skip
        for mode in ("frozen", "batch-stats")
    }
    frozen, batch = rows["frozen"], rows["batch-stats"]
    assert frozen["loss_rel_diff"] < 1e-4 and frozen["train_infer_rel_gap"] < 1e-4
    assert frozen["board_eval_accuracy"] == frozen["host_eval_accuracy"]
    # with batch statistics the training graph optimises another function than the exported model
    assert batch["train_infer_rel_gap"] > 1e-3
