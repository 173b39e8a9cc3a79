"""recipes/keypoints.toml through the odl flow: a heatmap U-Net pretrained on generated stick figures
of one domain is fine-tuned on the board on a shifted one and promoted on a significant OKS AP gain
(paired bootstrap over the test images on pycocotools' keypoint matches), with the per-keypoint
table and the drawn keypoints in its report and the board's PCK in its epochs; a candidate no better than it (its heatmaps moved by a
few pixels) is refused, naming its OKS AP interval. tests/e2e/test_flow_vboard.py runs these on the
virtual board."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.flow.test_flow import _artifacts, _run

pytestmark = pytest.mark.slow
NAMES = ["head", "left_hand", "right_hand", "left_foot", "right_foot"]


@pytest.fixture(scope="module")
def keypoints_run(prefect_harness, flow_home, flow_board):
    from tasks.paths import PROJECT_ROOT

    run_id, out = _run(flow_board.name, recipe=str(PROJECT_ROOT / "recipes" / "keypoints.toml"))
    return run_id, out, flow_board.name


def test_keypoints_are_promoted_on_a_significant_oks_ap_gain(keypoints_run):
    from device_agent.keypoints import image_pck
    from tasks import stages
    from tasks.judge.runtime import run_model
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe

    run_id, out, board = keypoints_run
    base, cand = out.metrics["base"], out.metrics["candidate"]
    print(out.summary)
    assert out.promoted, out.summary
    assert cand["loss_kind"] == "keypoints-mse" and cand["loss"] < base["loss"]
    assert cand["oks_ap"] > base["oks_ap"] + 0.2 and cand["pck"] > base["pck"]
    assert list(cand["per_keypoint"]) == NAMES and cand["output"] == "heatmaps"
    version = next(v for v in stages.registry().versions("keypoints", board) if v.name == out.version)
    decision = version.info["decision"]
    assert decision["metric"] == "oks_ap"
    test = decision["significance"]
    print(f"oks_ap {base['oks_ap']:.4f} -> {cand['oks_ap']:.4f}: {test['reason']}")
    assert test["test"].startswith("paired bootstrap over 96 test images") and test["low"] > 0
    assert [c["kind"] for c in decision["checks"]] == ["min_gain", "significance"]
    assert "keypoints" not in version.metrics["per_sample"]  # the COCO matches stay in the cache
    recipe = load_recipe(PROJECT_ROOT / "recipes" / "keypoints.toml")
    history = json.loads((out.run_dir / "result.json").read_text())["history"]
    with np.load(recipe.data.eval) as data:  # the board's eval accuracy is its PCK at 0.1
        want = image_pck(run_model(out.run_dir / "inference.onnx", data["x"])[0], data["y"], (32, 32)).mean()
    print("board eval PCK by epoch:", [round(h["eval_accuracy"], 4) for h in history])
    assert history[-1]["eval_accuracy"] == pytest.approx(want, abs=1e-6)
    assert (
        history[0]["eval_accuracy"] < history[-1]["eval_accuracy"] and 0 < history[-1]["train_accuracy"] <= 1
    )
    report = _artifacts(run_id)[f"odl-report-keypoints-{board}"].data
    for text in ("| OKS AP@[.5:.95] |", "| PCK |", "Keypoints: PCK and mean error per keypoint",
                 "| left_hand |", "![test keypoints 0](data:image/png"):  # fmt: skip
        assert text in report


def _shifted(model_path, out_path, cells: int = 1):
    """The model with its heatmaps moved ``cells`` cells right and down (zeros shifted in): each
    keypoint found that far from where the model put it."""
    model = onnx.load(str(model_path))
    out = model.graph.output[0]
    raw = out.name + "_unshifted"
    for node in model.graph.node:
        node.output[:] = [raw if o == out.name else o for o in node.output]
    side = [d.dim_value for d in out.type.tensor_type.shape.dim][2:]
    consts = {"starts": [0, 0], "ends": [side[0] - cells, side[1] - cells], "axes": [2, 3],
              "pads": [0, 0, cells, cells, 0, 0, 0, 0]}  # fmt: skip
    model.graph.initializer.extend(
        numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()
    )
    model.graph.node.extend([
        helper.make_node("Slice", [raw, "starts", "ends", "axes"], ["cropped"]),
        helper.make_node("Pad", ["cropped", "pads"], [out.name]),
    ])  # fmt: skip
    onnx.save(model, str(out_path))
    return out_path


def test_a_candidate_no_better_is_rejected_with_its_oks_ap_interval(keypoints_run, tmp_path):
    """The promoted model in service, a candidate that puts each keypoint a few pixels off: the
    refusal names the OKS AP gain's interval, which lies below zero."""
    from tasks.judge.decision import decide
    from tasks.judge.evaluate import evaluate
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe

    _, out, _ = keypoints_run
    recipe = load_recipe(PROJECT_ROOT / "recipes" / "keypoints.toml")
    served = out.run_dir / "inference.onnx"
    candidate = _shifted(served, tmp_path / "shifted.onnx")
    judged = {
        m: evaluate(m, recipe.data.test, "keypoints", keypoints=recipe.keypoints) for m in (served, candidate)
    }
    cand, current = judged[candidate], judged[served]
    assert cand["oks_ap"] < current["oks_ap"]
    d = decide(cand, current, recipe.promotion, "current")
    assert not d.promote
    low, high = d.significance["low"], d.significance["high"]
    print(f"served oks_ap {current['oks_ap']:.4f}, shifted {cand['oks_ap']:.4f}: {d.reason}")
    assert high < 0 and d.significance["test"].startswith("paired bootstrap over 96 test images")
    assert f"the oks_ap gain {d.gain:+.4f} lies in [{low:+.4f}, {high:+.4f}] (95%)" in d.reason
