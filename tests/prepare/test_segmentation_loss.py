"""The segmentation losses as ORT trains them: the generated graphs compute the host's numpy losses
(per-pixel cross-entropy over [N, C, H, W] with an ignore index, soft Dice, their sum), their
labels input is [N, H, W], training lowers them, and a classification recipe with per-pixel
outputs is told to use task segmentation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tasks.errors import RecipeError
from tasks.judge.segmentation_losses import loss_sums, set_loss
from tasks.prepare.losses.segmentation import segmentation_loss

CLASSES, SIDE = 3, 5


def _conv_model(classes: int = CLASSES) -> onnx.ModelProto:
    """input [batch, 2, SIDE, SIDE] -> a 1x1 Conv -> scores [batch, classes, SIDE, SIDE]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (classes, 2, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(classes, np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w", "b"], ["scores"])],
        "seg",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 2, SIDE, SIDE])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", classes, SIDE, SIDE])],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture(scope="module", params=[("cross-entropy", 255), ("dice", 255), ("cross-entropy+dice", -100)])
def trained(request, tmp_path_factory):
    """ORT's training objects for one loss kind and ignore index."""
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    kind, ignore = request.param
    out = tmp_path_factory.mktemp(kind.replace("+", "-"))
    loss = segmentation_loss(kind, CLASSES, ignore, dice_weight=0.5)
    artifacts.generate_artifacts(_conv_model(), requires_grad=["w", "b"], loss=loss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=out,
                                 additional_output_names=["scores"])  # fmt: skip
    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    module = Module(str(out / "training_model.onnx"), state, str(out / "eval_model.onnx"))
    return kind, ignore, module, Optimizer(str(out / "optimizer_model.onnx"), module), out


def _batch(seed: int, n: int, ignored: float, ignore: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 2, (n, 2, SIDE, SIDE)).astype(np.float32)
    y = rng.integers(0, CLASSES, (n, SIDE, SIDE)).astype(np.int64)
    y[rng.uniform(size=y.shape) < ignored] = ignore
    return x, y


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 4), ignored=st.floats(0, 0.9))
@example(seed=3, n=2, ignored=0.0)
def test_the_graph_computes_the_hosts_loss(trained, seed, n, ignored):
    kind, ignore, module, _, out = trained
    x, y = _batch(seed, n, ignored, ignore)
    if (y != ignore).sum() == 0 and kind != "dice":
        y[0, 0, 0] = 0  # an all-ignored batch has no cross-entropy (0 / 0)
    module.eval()
    loss, scores = module(x, y)
    want = set_loss(kind, loss_sums(np.asarray(scores), y, ignore), dice_weight=0.5)
    assert float(loss) == pytest.approx(want, rel=1e-4, abs=1e-5)
    labels = next(i for i in onnx.load(str(out / "eval_model.onnx")).graph.input if i.name == "labels")
    dims = [d.dim_value or d.dim_param for d in labels.type.tensor_type.shape.dim]
    assert dims == ["batch", SIDE, SIDE] and labels.type.tensor_type.elem_type == TensorProto.INT64


def test_training_lowers_the_loss(trained):
    kind, ignore, module, optimizer, _ = trained
    x, y = _batch(1, 8, 0.2, ignore)
    truth = np.einsum("kc,nchw->nkhw", np.random.default_rng(2).normal(0, 1, (CLASSES, 2)), x).argmax(1)
    y = np.where(y == ignore, ignore, truth)  # labels a 1x1 convolution can learn
    module.train()
    optimizer.set_learning_rate(0.1)
    losses = []
    for _ in range(30):
        losses.append(float(module(x, y)[0]))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.7 * losses[0], (kind, losses)


def test_a_wrong_output_shape_is_one_line_naming_the_loss():
    from onnxruntime.training import onnxblock

    model = _conv_model(classes=4)
    with pytest.raises(RecipeError, match=r"loss.kind': expected a segmentation output of shape \[batch, "
                                          r"num_classes=3, H, W\] for 'dice'.*shape \[batch, 4, 5, 5\]"):  # fmt: skip
        with onnxblock.base(model):
            segmentation_loss("dice", 3, 255)("scores")


def test_a_classification_cross_entropy_on_per_pixel_scores_says_task_segmentation(tmp_path):
    from tasks.prepare.runtimes.ort_training.generate import build_loss
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(Path(__file__).parents[2] / "recipes" / "segmentation.toml")
    classifier = dataclasses.replace(recipe, task="classification", segmentation=None,
                                     promotion=dataclasses.replace(recipe.promotion, metric="accuracy"))  # fmt: skip
    with pytest.raises(RecipeError, match='per-pixel class scores .* are task = "segmentation"'):
        build_loss(classifier, _conv_model(classes=4))
    block, name = build_loss(recipe, _conv_model(classes=4))
    assert name == "cross-entropy (per pixel, ignore_index 255)"


def test_a_custom_per_pixel_loss_names_the_labels_dims_it_expects(tmp_path):
    """The issue's case: a custom onnxblock loss (ORT's own CrossEntropyLoss, classes on the last
    axis) on scores [batch, 4, height, width] makes the labels [batch, 4, height]; masks (96, 64, 64)
    are refused, on the host and on the board, with the dims named as the graph names them (read
    "(N, 4, N), got (96, 64, 64)" before: height is not the batch)."""
    from onnxruntime.training import artifacts, onnxblock

    from device_agent.data.checks import check_dataset, model_io
    from device_agent.errors import AgentError
    from tasks.prepare.validation.data_checks import board_inputs

    w = numpy_helper.from_array(np.ones((4, 2, 1, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["scores"])], "seg",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 2, "height", "width"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4, "height", "width"])], [w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    artifacts.generate_artifacts(model, requires_grad=["w"], loss=onnxblock.loss.CrossEntropyLoss(),
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)  # fmt: skip
    manifest = {"files": {"eval_model": {"path": "eval_model.onnx"}}, "feeds": {"input": "x", "labels": "y"}}
    host = board_inputs(tmp_path, manifest)
    board, _ = model_io(str(tmp_path / "eval_model.onnx"), ["input", "labels"])
    assert [s.shape_text() for s in host] == [s.shape_text() for s in board] == ["(N, 2, height, width)",
                                                                                 "(N, 4, height)"]  # fmt: skip
    x, y = np.zeros((96, 2, 64, 64), np.float32), np.zeros((96, 64, 64), np.int64)
    for inputs in (host, board):
        with pytest.raises(AgentError) as caught:
            check_dataset(_Data(x, y), inputs, "segmentation", 4, "train_data", 255)
        assert str(caught.value) == ("train_data: input 'labels': expected shape (N, 4, height), got (96, 64, 64) "
                                     "(axis 1: 64, the model's input takes 4)")  # fmt: skip


class _Data:
    """A data set as the board's check reads it: its arrays by input name."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.arrays = {"input": x, "labels": y}

    def __len__(self) -> int:
        return len(self.arrays["input"])
