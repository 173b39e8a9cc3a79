"""BatchNorm benchmark: frozen running statistics vs ORT's batch statistics during on-board training.

For each recipe and each ``trainable.batchnorm`` option it trains on a board (the agent in the
torch-free board venv, reached through the local transport: the same agent and ONNX Runtime as
the virtual board, without sshd), then evaluates the retrieved inference model on the host on the
same eval set with the recipe's loss (:mod:`tasks.stages.agreement`). The table gives the board's
final train and eval loss, the host's eval loss, their relative difference (target < 1e-4 with
frozen BN), the training graph's loss on the same set with the same weights (what training
optimises) and its gap to the inference model's, and the accuracy after fine-tuning on the test set.

    .venv/bin/python bench/batchnorm.py            # digits, embedded_loss, mobilenet_v2 (~5 min)
    .venv/bin/python bench/batchnorm.py --quick    # digits, one epoch
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, odl_home, table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

MODES = ("frozen", "batch-stats")
RECIPES = {  # recipe -> overrides every run gets (mobilenet_v2's recipe has no eval set of its own)
    "digits": {},
    "embedded_loss": {},
    "mobilenet_v2": {"data.eval": "data/textures/test.npz"},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="digits only, one epoch")
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/batchnorm.json)")
    args = ap.parse_args()
    from tasks.board.inventory import Board, save_board
    from tasks.stages.agreement import board_vs_host
    from tasks.vboard.venv import ensure_board_venv

    python = ensure_board_venv(BOARD_VENV)
    recipes = {"digits": {"training.epochs": 1}} if args.quick else RECIPES
    rows = []
    with tempfile.TemporaryDirectory(prefix="odl-bench-bn-") as tmp, odl_home(Path(tmp)) as home:
        save_board(Board(name="bench", transport="local", root=str(home / "board"), python=str(python)),
                   home / "inventory.toml")  # fmt: skip
        for name, extra in recipes.items():
            for mode in MODES:
                overrides = {**extra, "trainable.batchnorm": mode}
                path = PROJECT_ROOT / "recipes" / f"{name}.toml"
                rows.append(board_vs_host(path, "bench", home / "runs" / f"{name}-{mode}", overrides))
                r = rows[-1]
                print(f"{name:14s} {mode:12s} board {r['board_eval_loss']:.6g} host {r['host_eval_loss']:.6g} "
                      f"rel {r['loss_rel_diff']:.2e}", flush=True)  # fmt: skip
    frozen = [r["loss_rel_diff"] for r in rows if r["batchnorm"] == "frozen"]
    figures = {"rows": rows, "max_rel_diff_frozen": max(frozen), "target_rel_diff": 1e-4}
    path = write_results("batchnorm", figures, args.out)
    print(table(rows, [("recipe", "recipe"), ("batchnorm", "batchnorm"), ("loss_kind", "loss"),
                       ("board_train_loss", "board train"), ("board_eval_loss", "board eval"),
                       ("host_eval_loss", "host eval"), ("loss_rel_diff", "rel diff"),
                       ("training_graph_eval_loss", "train-graph eval"), ("train_infer_rel_gap", "train/infer gap"),
                       ("board_eval_accuracy", "board eval acc"), ("host_eval_accuracy", "host eval acc"),
                       ("test_accuracy", "test acc"), ("test_loss", "test loss")]))  # fmt: skip
    print(f"frozen BN: max relative difference board vs host {max(frozen):.2e} (target < 1e-4)")
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
