"""Accuracy and loss reported by the agent agree with the exported model evaluated on the host;
image-folder datasets train where Pillow exists and fail clearly where it does not."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from device_agent.protocol import DataRef, ExitCode
from tasks.paths import PROJECT_ROOT
from tests.fixtures_agent import AgentBoard


@pytest.fixture
def logits_job(digits_recipe, prepared_digits):
    """Jobs on odl prepare's artifacts, whose train/eval graphs also output the logits."""
    from tasks.prepare.board_job import build_job_spec

    def make(job_id: str, **train):
        spec, files = build_job_spec(digits_recipe, prepared_digits, job_id)
        return replace(spec, train=replace(spec.train, **train)), files

    return make


def test_eval_accuracy_matches_exported_model_on_host(agent_board, logits_job, digits_recipe, tmp_path):
    import onnxruntime

    from tasks.prepare.prefix import stitch

    spec, files = logits_job("acc", epochs=4)
    jdir = agent_board.install(spec, files)
    run = agent_board.run("run", str(jdir))
    assert run.code == 0, run.err
    res = run.last
    assert [row["epoch"] for row in res["history"]] == [1, 2, 3, 4]
    assert {"train_loss", "train_accuracy", "eval_loss", "eval_accuracy"} <= res["metrics"].keys()
    with np.load(digits_recipe.data.eval) as data:
        x, y = data["x"], data["y"]
    model = jdir / "inference.onnx"
    if spec.prefix is not None:  # the board trained the suffix: the host joins the prefix back
        model = stitch(files[spec.prefix.model.sha256], model, tmp_path / "whole.onnx")
    sess = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = sess.run(None, {sess.get_inputs()[0].name: x.astype(np.float32)})[0]
    assert res["metrics"]["eval_accuracy"] == pytest.approx(float((logits.argmax(1) == y).mean()), abs=1e-9)
    assert res["history"][-1]["eval_loss"] < res["history"][0]["eval_loss"]


def _image_folder(root, recipe) -> int:
    from PIL import Image

    with np.load(recipe.data.train) as data:
        x, y = data["x"][:96], data["y"][:96]
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        folder = root / "images" / f"class{int(label)}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(img[0] * 255 / max(1e-6, float(x.max())), 0, 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"{i}.png")
    return len(x)


def test_image_folder_dataset(agent_board, logits_job, digits_recipe):
    n = _image_folder(agent_board.root, digits_recipe)
    spec, files = logits_job("images", epochs=2, batch_size=16)
    spec = replace(spec, train_data=DataRef("image-folder", path="images"), eval_data=None)
    no_pillow = agent_board.run("run", str(agent_board.install(spec, files)))  # the board venv has no Pillow
    assert no_pillow.code == ExitCode.ENVIRONMENT
    assert "image-folder datasets need Pillow" in no_pillow.last["error"]

    host = AgentBoard(PROJECT_ROOT / ".venv" / "bin" / "python", agent_board.root)  # has Pillow
    spec = replace(spec, job_id="images2")
    run = host.run("run", str(host.install(spec, files)))
    assert run.code == 0, run.err
    assert run.last["steps"] == 2 * -(-n // 16) and "train_accuracy" in run.last["metrics"]
