"""Frozen-prefix caching: where the cut goes, and a split job trains exactly as the full graph.

The same tiny recipe is prepared twice, with ``training.prefix_cache`` "auto" (the board runs the
frozen prefix once per sample and trains the suffix on the cached outputs) and "off" (the full
graph at every step, BatchNorm frozen in both). Both jobs run on a local board through the
pipeline's stages; their loss curves, final weights and retrieved inference models must agree.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.prepare.kit import tiny_recipe

DEEP = {
    "model": {"callable": "tinymodels:dropout_net"},
    "training": {"batch_size": 16, "epochs": 3, "checkpoint_every": 4},
    "data": {"eval": "data/test.npz"},
}


def _prepare(folder, changes):
    from tasks.prepare.pipeline import prepare

    folder.mkdir()
    recipe = tiny_recipe(folder, changes)
    return recipe, prepare(recipe, folder / "out", validate=False)


def _run(board, recipe, prep, job, out):
    from tasks import stages
    from tasks.prepare.board_job import build_job_spec

    spec, files = build_job_spec(recipe, prep, job)
    stages.deploy(board, spec, files)
    training = stages.train(board, spec, files)
    return spec, training, stages.retrieve(board, training, out)


def test_cut_found_after_the_frozen_part_and_refused_otherwise(tmp_path):
    _, prep = _prepare(tmp_path / "a", {"model": {"callable": "tinymodels:tiny"}})
    entry = prep.manifest["prefix_cache"]
    assert entry["enabled"], entry
    assert entry["prefix_inputs"] == ["input"] and entry["feature_shape"][1:] == [64]
    prefix = onnx.load(str(prep.out_dir / entry["files"]["prefix_model"]["path"]))
    assert {n.op_type for n in prefix.graph.node} >= {"Conv", "Relu"}
    assert not {i.name for i in prefix.graph.initializer} & set(prep.manifest["trainable"])

    _, every = _prepare(tmp_path / "b", {"trainable": {"strategy": "all"}})
    assert not every.manifest["prefix_cache"]["enabled"]
    assert "acts on the model input" in every.manifest["prefix_cache"]["reason"]

    _, off = _prepare(tmp_path / "c", {"training": {"prefix_cache": "off"}})
    assert off.manifest["prefix_cache"] == {"enabled": False, "reason": "training.prefix_cache = 'off'"}
    assert not (off.out_dir / "artifacts" / "split").exists()


def test_random_op_before_the_cut_keeps_the_full_graph(tmp_path):
    _, prep = _prepare(
        tmp_path / "r", {"model": {"callable": "tinymodels:random_depth", "kwargs": {"own_random": True}}}
    )
    entry = prep.manifest["prefix_cache"]
    assert not entry["enabled"] and "random" in entry["reason"], entry


def _weights(path):
    """One set of starting weights for both recipes (a random init differs per export)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("tinymodels_w", path.parent / "tinymodels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    torch.manual_seed(0)
    torch.save(mod.dropout_net(3).state_dict(), path)
    return str(path)


@pytest.mark.slow
def test_split_training_equals_full_graph_training(tmp_path, local_board):
    (tmp_path / "w").mkdir()
    tiny_recipe(tmp_path / "w")  # writes tinymodels.py
    weights = _weights(tmp_path / "w" / "w.pt")
    r_on, on = _prepare(tmp_path / "on", {**DEEP, "model": {**DEEP["model"], "weights": weights}})
    off_changes = {**DEEP, "model": {**DEEP["model"], "weights": weights}}
    r_off, off = _prepare(
        tmp_path / "off", {**off_changes, "training": {**DEEP["training"], "prefix_cache": "off"}}
    )
    assert on.manifest["prefix_cache"]["enabled"] and not off.manifest["prefix_cache"]["enabled"]
    spec_on, t_on, got_on = _run(local_board, r_on, on, "split", tmp_path / "got-on")
    spec_off, t_off, got_off = _run(local_board, r_off, off, "full", tmp_path / "got-off")
    assert spec_on.prefix is not None and spec_off.prefix is None

    caches = [e.data for e in t_on.events if e.type == "cache"]
    assert {c["field"] for c in caches} == {"train_data", "eval_data"}
    assert all(c["store"] == "ram" and c["dtype"] == "float32" for c in caches)
    h_on, h_off = t_on.result.history, t_off.result.history
    assert len(h_on) == len(h_off) == 3
    for a, b in zip(h_on, h_off, strict=True):
        for key in ("train_loss", "eval_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), (key, a, b)
    steps_on = [e.data["loss"] for e in t_on.events if e.type == "step"]
    steps_off = [e.data["loss"] for e in t_off.events if e.type == "step"]
    np.testing.assert_allclose(steps_on, steps_off, rtol=1e-5)

    w_on, w_off = np.load(got_on.files["trainable"]), np.load(got_off.files["trainable"])
    assert sorted(w_on.files) == sorted(w_off.files) == sorted(on.manifest["trainable"])
    for name in w_on.files:
        np.testing.assert_allclose(w_on[name], w_off[name], rtol=0, atol=1e-6, err_msg=name)

    # the retrieved model is the whole network again: same inputs, same answers as the full job's
    from device_agent.ort import load_onnxruntime

    ort = load_onnxruntime()
    x = np.load(r_on.data.test)["x"]
    whole = ort.InferenceSession(str(got_on.inference), providers=["CPUExecutionProvider"])
    full = ort.InferenceSession(str(got_off.inference), providers=["CPUExecutionProvider"])
    assert [i.name for i in whole.get_inputs()] == ["input"]
    np.testing.assert_allclose(whole.run(None, {"input": x})[0], full.run(None, {"input": x})[0], atol=1e-5)
    assert got_on.files["inference_suffix"].exists()
    whole_model = onnx.load(str(got_on.inference))
    domains = [o.domain for o in whole_model.opset_import]
    assert len(domains) == len(set(domains)), domains  # one entry per domain (the int8 quantizer needs it)


@pytest.mark.slow
def test_float16_cache_on_disk_trains_close_to_float32(tmp_path, local_board):
    changes = {**DEEP, "training": {**DEEP["training"], "cache_dtype": "float16", "cache_store": "disk"}}
    r16, p16 = _prepare(tmp_path / "half", changes)
    spec, training, got = _run(local_board, r16, p16, "half", tmp_path / "got")
    assert spec.prefix is not None and (spec.prefix.dtype, spec.prefix.store) == ("float16", "disk")
    caches = [e.data for e in training.events if e.type == "cache"]
    assert {(c["field"], c["store"], c["dtype"]) for c in caches} == {
        ("train_data", "disk", "float16"),
        ("eval_data", "disk", "float16"),
    }
    train = next(c for c in caches if c["field"] == "train_data")
    assert train["shape"] == [96, 64] and train["mb"] == pytest.approx(96 * 64 * 2 / 2**20, abs=0.005)
    history = training.result.history
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert got.inference.exists()
