"""The digits recipe prepares into the documented layout with a consistent manifest."""

from __future__ import annotations

import hashlib
import json


def test_prepared_layout(prepared_digits):
    p = prepared_digits
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"):
        assert (p.artifacts_dir / name).is_file()
    assert p.model_onnx == p.out_dir / "model.onnx"
    assert json.loads(p.manifest_path.read_text()) == p.manifest


def test_manifest_hashes_match_files(prepared_digits):
    for entry in prepared_digits.manifest["files"].values():
        data = (prepared_digits.out_dir / entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data) == entry["size"]


def test_digits_trains_last_conv_and_classifier(prepared_digits):
    m = prepared_digits.manifest
    # the last conv comes with the scale and bias of the BatchNorm right after it
    assert m["trainable"] == ["conv2.weight", "conv2.bias", "bn2.weight", "bn2.bias", "fc.weight", "fc.bias"]
    assert m["trainable_count"] == 16 * 32 * 9 + 32 + 2 * 32 + 512 * 10 + 10
    # frozen BatchNorm: the running statistics became constants of the affine rewrite
    assert m["batchnorm"] == "frozen" and m["fixups"]["batchnorm_frozen"] == 2
    assert not {"bn2.running_mean", "bn1.weight"} & set(m["frozen"]) and "bn2.weight" not in m["frozen"]
    assert (m["opset"], m["loss"], m["feeds"]) == (17, "cross-entropy", {"input": "x", "labels": "y"})
