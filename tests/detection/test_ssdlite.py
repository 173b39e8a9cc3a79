"""The reference detector (recipes/ssdlite_small.toml, SSD-Lite MobileNetV2 at 96 px): its loss in
the graph prepares, trains offline and exports an inference model images -> (scores, offsets)
whose outputs equal the PyTorch model's, decoded by the board's numpy helper."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.paths import PROJECT_ROOT


@pytest.fixture(scope="module")
def prepared_ssd(tmp_path_factory):
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(PROJECT_ROOT / "recipes" / "ssdlite_small.toml")
    return recipe, prepare(recipe, tmp_path_factory.mktemp("ssd") / "out")


def test_detector_prepares_with_its_loss_in_the_graph(prepared_ssd):
    _, done = prepared_ssd
    m, v = done.manifest, done.validation
    assert m["loss"] == "embedded" and m["inference_output_names"] == ["scores", "offsets"]
    assert m["feeds"] == {"images": "x", "labels": "y", "gt_offsets": "offsets"}
    assert all(n.startswith(("cls_heads.", "box_heads.")) for n in m["trainable"])
    assert v["passed"] and v["checks"]["inference_matches_torch"]["max_abs_diff"] < 1e-3


def test_inference_model_decodes_like_torch(prepared_ssd):
    import onnxruntime
    import torch

    from device_agent import detection as det
    from tasks.prepare.export.torch_model import build_model

    recipe, done = prepared_ssd
    sess = onnxruntime.InferenceSession(
        str(done.out_dir / "validation_inference.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.name for i in sess.get_inputs()] == ["images"]
    images = np.load(recipe.data.test)["x"][:4]
    scores, offsets = sess.run(["scores", "offsets"], {"images": images})
    priors = det.priors(build_model(recipe).specs, 96)
    assert scores.shape == (4, len(priors), 4) and offsets.shape == (4, len(priors), 4)
    np.testing.assert_allclose(scores.sum(-1), 1.0, rtol=1e-5)
    model = build_model(recipe)
    from onnx import load, numpy_helper

    trained = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy())
               for i in load(str(done.out_dir / "validation_inference.onnx")).graph.initializer}  # fmt: skip
    state = model.state_dict()
    state.update({k: v for k, v in trained.items() if k in state})
    model.load_state_dict(state)
    with torch.no_grad():
        logits, t_offsets = model.heads(torch.from_numpy(images))
    np.testing.assert_allclose(scores, torch.softmax(logits, -1).numpy(), atol=1e-5)
    np.testing.assert_allclose(offsets, t_offsets.numpy(), atol=1e-4)
    for boxes, labels, conf in det.postprocess(scores, offsets, priors, score_threshold=0.05):
        assert (boxes >= 0).all() and (boxes <= 1).all() and ((labels >= 0) & (labels < 3)).all()
        assert (np.diff(conf) <= 0).all()  # best first


def test_priors_are_written_beside_the_export(prepared_ssd):
    from tasks.prepare.export.torch_model import build_model

    recipe, done = prepared_ssd
    priors = np.load(done.priors)
    np.testing.assert_array_equal(priors, build_model(recipe).priors())
    import onnx

    offsets = next(o for o in onnx.load(str(done.model_onnx)).graph.output if o.name == "offsets")
    assert priors.shape == (offsets.type.tensor_type.shape.dim[1].dim_value, 4)


def test_the_st_scripts_trainable_sets(prepared_ssd):
    """freeze_net trains the heads only, freeze_basenet the extras and heads (never the backbone's
    stem and trunk), an explicit list exactly its names; BatchNorm statistics are never trained."""
    import onnx

    from tasks.errors import RecipeError
    from tasks.prepare.trainable import bn_statistics, resolve_trainable
    from tasks.recipe.load import load_recipe

    _, done = prepared_ssd
    model = onnx.load(str(done.model_onnx))
    path = PROJECT_ROOT / "recipes" / "ssdlite_small.toml"
    heads, _, _ = resolve_trainable(load_recipe(path), model)
    assert heads and all(n.startswith(("cls_heads.", "box_heads.")) for n in heads)
    base, _, counts = resolve_trainable(load_recipe(path, {"trainable.strategy": "freeze_basenet"}), model)
    assert set(heads) < set(base) and any(n.startswith("extras.") for n in base)
    assert not any(n.startswith(("stem.", "trunk.")) for n in base) and not set(base) & bn_statistics(model)
    assert len(base) < len(counts)
    only = load_recipe(path, {"trainable": {"names": heads[:2], "batchnorm": "frozen"}})
    assert resolve_trainable(only, model)[0] == heads[:2]
    with pytest.raises(RecipeError) as info:
        resolve_trainable(load_recipe(path, {"trainable.heads": ["head.*"]}), model)
    assert info.value.field == "trainable.heads"


def test_host_evaluation_scores_the_detector_with_coco_map(prepared_ssd):
    from tasks.judge.evaluate import evaluate
    from tasks.judge.losses import host_loss
    from tasks.stages.judge import inference_of

    recipe, done = prepared_ssd
    base = inference_of(done, done.checkpoint, done.out_dir / "base.onnx")  # as the board exports it
    m = evaluate(base, recipe.data.test, recipe.task, loss=host_loss(recipe, done),
                 detection=recipe.detection, priors=done.priors)  # fmt: skip
    assert m["loss_kind"] == "embedded" and m["loss"] > 0
    assert 0.0 <= m["map"] <= m["map50"] <= 1.0 and set(m["per_class_ap50"]) == set(recipe.detection.classes)
    assert len(m["examples"]) == 4 and m["classes"] == list(recipe.detection.classes)


def test_the_gate_rejects_detection_noise_and_names_its_interval(prepared_ssd, tmp_path):
    """The issue's measured cases replayed through the gate: a detector whose mAP@0.5 or embedded
    loss moves by noise (ST's SSD: mAP@0.5 0.0030 -> 0.0034, loss 11.92 -> 11.06, both promoted on
    min_gain alone) is rejected, with the paired bootstrap's interval in the reason."""
    import onnx
    from onnx import numpy_helper

    from tasks.judge.evaluate import evaluate
    from tasks.judge.losses import host_loss
    from tasks.judge.registry import decide
    from tasks.recipe.extras import PromotionSpec
    from tasks.stages.judge import inference_of

    recipe, done = prepared_ssd
    base = inference_of(done, done.checkpoint, tmp_path / "base.onnx")

    def score(model):
        return evaluate(model, recipe.data.test, recipe.task, loss=host_loss(recipe, done),
                        detection=recipe.detection, priors=done.priors)  # fmt: skip

    ref = score(base)
    assert len(ref["per_sample"]["loss"]) == 64 and ref["per_sample"]["detection"]["images"] == 64
    seen = set()
    for seed in range(12):  # heads nudged by 2 % noise: small moves of either sign
        model = onnx.load(str(base))
        rng = np.random.default_rng(seed)
        for t in model.graph.initializer:
            if t.name.startswith("cls_heads."):
                w = numpy_helper.to_array(t)
                t.CopyFrom(
                    numpy_helper.from_array((w * rng.normal(1, 0.02, w.shape)).astype(w.dtype), t.name)
                )
        path = tmp_path / f"nudged-{seed}.onnx"
        onnx.save(model, str(path))
        cand = score(path)
        loss = decide(cand, ref, PromotionSpec("loss", 0.0, 0.05, extra_tests_tolerance=None), "base")
        test = loss.significance  # the embedded loss is always tested now, per image
        assert test["test"].startswith("paired bootstrap") and "per-sample loss gain lies in [" in loss.reason
        assert loss.promote == (loss.gain > 0 and test["low"] > 0)
        spec = PromotionSpec("map50", 0.0, 0.05, extra_tests_tolerance=None)
        d = decide(cand, ref, spec, "base")
        if d.gain < 0:  # the nudge lost a little: then the base gains by noise over the nudged model
            d = decide(ref, cand, spec, "nudged")
        if d.gain > 0:  # the gate follows its own test: promoted only when the interval excludes 0
            assert d.promote == (d.significance["low"] > 0), d.reason
            if not d.promote:
                seen.add(seed)
                assert d.reason.startswith(
                    "FAIL significance: paired bootstrap over 64 test images: the map50 gain"
                )
                assert "which includes no gain" in d.reason
        if seen:
            break
    # a noise "gain" in mAP@0.5 (either direction of the nudge) was met and refused; a nudge whose gain
    # happens to clear the 95 % interval (about 1 in 20, and mAP@0.5 of a barely trained detector moves
    # with the evaluation's float rounding) is the test's own false positive, not a gate error
    assert seen
