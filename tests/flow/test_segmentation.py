"""recipes/segmentation.toml through the odl flow: a U-Net pretrained on one domain of generated
shapes is fine-tuned on the board on a shifted one and promoted on a significant mIoU gain (paired
bootstrap over the test images), with the board's pixel accuracy, the per-class IoU table and the
drawn masks in its report; the same test set refuses a candidate that predicts only the background,
naming its mIoU interval. tests/e2e/test_flow_vboard.py runs these on the virtual board."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.flow.test_flow import _artifacts, _run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def segmentation_run(prefect_harness, flow_home, flow_board):
    from tasks.paths import PROJECT_ROOT

    run_id, out = _run(flow_board.name, recipe=str(PROJECT_ROOT / "recipes" / "segmentation.toml"))
    return run_id, out, flow_board.name


def _pixel_accuracy(model, x: np.ndarray, y: np.ndarray, ignore: int = 255) -> float:
    """Mean over images of the share of kept pixels the model's argmax gets right."""
    from tasks.judge.runtime import run_model

    pred = run_model(model, x)[0].argmax(1)
    kept = y != ignore
    return float(np.mean([(p == t)[k].mean() for p, t, k in zip(pred, y, kept, strict=True)]))


@pytest.mark.vboard
def test_segmentation_is_promoted_on_a_significant_miou_gain(segmentation_run):
    from tasks import stages
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe

    run_id, out, board = segmentation_run
    base, cand = out.metrics["base"], out.metrics["candidate"]
    assert out.promoted, out.summary
    assert cand["loss_kind"] == "pixel-cross-entropy" and cand["loss"] < base["loss"]
    assert cand["miou"] > base["miou"] and cand["object_miou"] > base["object_miou"]
    assert set(cand["per_class_iou"]) == {"background", "square", "disc", "triangle"}
    version = next(v for v in stages.registry().versions("segmentation", board) if v.name == out.version)
    decision = version.info["decision"]
    assert decision["metric"] == "miou"
    test = decision["significance"]
    assert test["test"].startswith("paired bootstrap over 96 test images") and test["low"] > 0
    kinds = ["min_gain", "significance", "objects", "class", "class", "class"]  # each object class guarded
    assert [c["kind"] for c in decision["checks"]] == kinds
    ious = cand["per_class_iou"]
    assert all(ious[c] >= 0.05 for c in ("square", "disc", "triangle")), ious
    assert all(c["holds"] for c in decision["checks"])
    assert "segmentation" not in version.metrics["per_sample"]  # per-image matrices stay in the cache
    recipe = load_recipe(PROJECT_ROOT / "recipes" / "segmentation.toml")
    history = json.loads((out.run_dir / "result.json").read_text())["history"]
    with np.load(recipe.data.eval) as data:  # the board's eval accuracy is its pixel accuracy
        want = _pixel_accuracy(out.run_dir / "inference.onnx", data["x"], data["y"])
    assert history[-1]["eval_accuracy"] == pytest.approx(want, abs=1e-6)
    assert 0 < history[-1]["train_accuracy"] <= 1
    report = _artifacts(run_id)[f"odl-report-segmentation-{board}"].data
    for text in ("| mIoU |", "| pixel accuracy |", "Segmentation: per-class IoU", "| IoU candidate",
                 "![test masks 0](data:image/png", "Per-class IoU gain"):  # fmt: skip
        assert text in report


def _background_only(model_path, out_path, background: int = 0):
    """The model with its output convolution's bias raised for the background class: it predicts
    background on every pixel, whatever the input."""
    model = onnx.load(str(model_path))
    last = next(n for n in reversed(model.graph.node) if n.op_type == "Conv")
    bias = next(t for t in model.graph.initializer if t.name == last.input[2])
    values = numpy_helper.to_array(bias).copy()
    values[background] += 1e4
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(out_path))
    return out_path


@pytest.mark.vboard
def test_a_background_only_candidate_is_rejected_with_its_miou_interval(segmentation_run, tmp_path):
    """The issue's replay on the real test set: a candidate that predicts only the background, judged
    against the untrained base, is refused; the refusal names the mIoU gain's interval and the object
    classes' figures, whether or not that mIoU gain alone is significant."""
    from tasks import stages
    from tasks.judge.decision import decide, headline
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe

    _, out, _ = segmentation_run
    recipe = load_recipe(PROJECT_ROOT / "recipes" / "segmentation.toml")
    prep = stages.prepare(stages.inputs(recipe))
    candidate = _background_only(out.run_dir / "inference.onnx", tmp_path / "background.onnx")
    evaluation = stages.evaluate(recipe, prep, candidate, stages.Reference("base"))
    cand, base = evaluation.test["candidate"], evaluation.test["base"]
    assert cand["predicted_background"] == 1.0 and cand["object_miou"] == 0.0
    d = decide(cand, base, recipe.promotion, "base")
    assert not d.promote
    low, high = d.significance["low"], d.significance["high"]
    assert f"the miou gain {d.gain:+.4f} lies in [{low:+.4f}, {high:+.4f}] (95%)" in d.reason
    assert "predicts background on 100.0% of the test pixels" in d.reason
    assert "no gain on the object classes" in headline(d)
