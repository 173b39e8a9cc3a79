"""Each weight an autograd job uploads, once (:mod:`tasks.prepare.runtimes.autograd.shared`): a model
whose frozen layers hold most of its parameters uploads no more bytes to the board under the
autograd runtime than under ONNX Runtime's training API (each frozen tensor went in the train
step, the eval step and the inference template, each trainable one in the template and the
checkpoint), and what the board assembles is the model the host prepared."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import numpy_helper

from device_agent.protocol import file_sha256
from device_agent.runtimes.autograd import AutogradApi
from device_agent.runtimes.weights import whole_model
from tasks.prepare.board_job import build_job_spec
from tasks.prepare.pipeline import prepare
from tasks.prepare.runtimes.autograd.shared import THRESHOLD
from tests.fixtures_prepare import needs_ort_training
from tests.prepare.kit import TINY_MODELS, tiny_recipe

FROZEN = """

class Frozen(nn.Module):  # a frozen body between a trained stem and head: no frozen prefix to cache
    def __init__(self, out):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(16, 48, 3, padding=1), nn.BatchNorm2d(48), nn.ReLU(),
                                  nn.Conv2d(48, 48, 3, padding=1), nn.BatchNorm2d(48), nn.ReLU())
        self.head = nn.Linear(48, out)

    def forward(self, x):
        return self.head(self.body(torch.relu(self.stem(x))).mean(dim=(2, 3)))


def frozen(num_classes=3):
    return Frozen(num_classes)
"""


def _prepared(tmp_path, runtime):
    recipe = tiny_recipe(tmp_path, {"model": {"callable": "tinymodels:frozen"}, "training": {"runtime": runtime},
                                    "trainable": {"strategy": None, "patterns": ["stem.*", "head.*"]}})  # fmt: skip
    (tmp_path / "tinymodels.py").write_text(TINY_MODELS + FROZEN)
    return recipe, prepare(recipe, tmp_path / runtime, validate=False)


def _uploaded(recipe, prepared) -> dict[str, int]:
    """The bytes of each artifact the board job uploads (the prefix model of a split job too)."""
    spec, _ = build_job_spec(recipe, prepared, "job-1")
    sizes = {key: ref.size for key, ref in spec.artifacts.items()}
    return sizes | ({"prefix_model": spec.prefix.model.size} if spec.prefix else {})


def _held(path) -> list[bytes]:
    model = onnx.load_from_string(path.read_bytes()) if path.suffix == ".onnx" else None
    if model is None:
        with np.load(path) as npz:
            return [npz[k].tobytes() for k in npz.files]
    return [i.raw_data for i in model.graph.initializer]


def test_a_mostly_frozen_model_uploads_no_more_than_under_ort_training(tmp_path):
    recipe, prepared = _prepared(tmp_path, "autograd")
    ours = _uploaded(recipe, prepared)
    assert not prepared.manifest["prefix_cache"]["enabled"]
    assert sum(ours.values()) < 2 * 48 * 48 * 9 * 4  # the frozen body's 83 kB, once (three times it was 268)
    where: dict[bytes, set[str]] = {}
    for key in ("train_step", "eval_step", "inference_template", "checkpoint"):
        for data in _held(prepared.out_dir / prepared.manifest["files"][key]["path"]):
            where.setdefault(data, set()).add(key)
    assert all(
        len(keys) == 1 for data, keys in where.items() if len(data) >= THRESHOLD
    )  # each weight in one file
    needs_ort_training()
    ort_recipe, ort_prepared = _prepared(tmp_path, "ort-training")
    assert sum(ours.values()) <= sum(_uploaded(ort_recipe, ort_prepared).values())


def test_the_board_assembles_the_files_the_host_prepared(tmp_path):
    """The eval step and the template with what they leave out appended, as the agent loads them,
    compute what the unshared files computed: the eval loss of the train step's forward, and the
    prepared model's outputs."""
    recipe, prepared = _prepared(tmp_path, "autograd")
    art = prepared.artifacts_dir
    step = json.loads((art / "step.json").read_text())
    sources = {r[0] for r in step["shared"]["eval_step"]["ranges"]}
    assert sources == {"train_step", "inference_template"}  # its frozen tensors, and its nodes the template's
    api = AutogradApi(art / "step.json", art / "inference_template.onnx")
    module = api.Module(str(art / "train_step.onnx"), api.CheckpointState.load_checkpoint(art / "checkpoint.npz"),
                        str(art / "eval_step.onnx"))  # fmt: skip
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 1, 4, 4)).astype(np.float32), np.array([0, 1, 2, 0, 1])
    train_loss = module.train()(x, y)[0]
    eval_loss = module.eval()(x, y)[0]
    np.testing.assert_allclose(eval_loss, train_loss, rtol=1e-6)  # frozen BatchNorm: the same forward
    evaluated = onnxruntime.InferenceSession(whole_model(art / "eval_step.onnx"))
    feeds = {"input": x, "labels": y} | {n: p.data for n, p in module.state.parameters}
    np.testing.assert_allclose(evaluated.run(["loss"], feeds)[0], eval_loss, rtol=1e-6)
    module.export_model_for_inferencing(
        str(tmp_path / "inference.onnx"), prepared.manifest["inference_output_names"]
    )
    exported = {
        i.name: numpy_helper.to_array(i)
        for i in onnx.load(str(tmp_path / "inference.onnx")).graph.initializer
    }
    model = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(prepared.model_onnx)).graph.initializer}
    assert exported.keys() <= model.keys() and all(np.array_equal(exported[n], model[n]) for n in exported)
    (want,) = onnxruntime.InferenceSession(str(prepared.model_onnx)).run(None, {"input": x})
    (got,) = onnxruntime.InferenceSession(str(tmp_path / "inference.onnx")).run(None, {"input": x})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_depthwise_convolution_s_weight_gradient_holds_no_one_hot_constant(tmp_path):
    """Its taps (each input channel's patches: a grouped convolution by one-hot kernels) come from
    an identity tiled in the graph: a [C_in * taps, 1, 3, 3] constant was 311 kB of the U-Net's
    train step for each of its wide depthwise layers."""
    import torch

    from tests.runtimes.test_graph_step import _assert_pytorch_s, _written

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 64, 1), torch.nn.Conv2d(64, 64, 3, padding=1, groups=64),
                                torch.nn.Flatten(), torch.nn.Linear(64 * 6 * 6, 3))  # fmt: skip
    x = torch.randn(5, 4, 6, 6)
    path, names, y, _ = _written(tmp_path, model, x, 3)
    _assert_pytorch_s(path, model, x, y, names)
    assert sum(len(i.raw_data) for i in onnx.load(str(path)).graph.initializer) < 64 * 9 * 9 * 4 // 4


TWICE = """

class Twice(nn.Module):  # a frozen conv applied before the trained one (the prefix) and after it
    def __init__(self, out):
        super().__init__()
        self.stem, self.mix = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.mid, self.head = nn.Conv2d(16, 16, 3, padding=1), nn.Linear(16, out)

    def forward(self, x):
        h = torch.relu(self.mix(torch.relu(self.stem(x))))
        return self.head(torch.relu(self.mix(torch.relu(self.mid(h)))).mean(dim=(2, 3)))


def twice(num_classes=3):
    return Twice(num_classes)
"""


def test_a_split_job_whose_prefix_and_train_step_share_a_tensor_is_built_from_its_entries(tmp_path):
    """The frozen prefix and the train step both hold ``mix``'s weight: the train step is rewritten
    without it and its manifest entry follows (the stale entry stopped every such job before any
    upload: "artifact train_step: ... its size differs from the manifest"); the board's split job
    trains to the full job's losses."""
    recipe = tiny_recipe(tmp_path, {"model": {"callable": "tinymodels:twice"}, "training": {"runtime": "autograd"},
                                    "trainable": {"strategy": None, "patterns": ["mid.*", "head.*"]}})  # fmt: skip
    (tmp_path / "tinymodels.py").write_text(TINY_MODELS + TWICE)
    prepared = prepare(recipe, tmp_path / "autograd", validate=False)
    split = prepared.manifest["prefix_cache"]
    assert split["enabled"], split
    for entry in split["files"].values():
        path = prepared.out_dir / entry["path"]
        assert path.stat().st_size == entry["size"] and file_sha256(path) == entry["sha256"], entry
    step = json.loads((prepared.out_dir / split["files"]["step"]["path"]).read_text())
    assert "prefix_model" in {r[0] for r in step["shared"]["train_step"]["ranges"]}  # mix's weight, once
    spec, files = build_job_spec(recipe, prepared, "job-1")
    assert spec.prefix is not None and all(Path(p).is_file() for p in files.values())
