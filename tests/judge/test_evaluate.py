"""Host evaluation against a real exported ONNX model, checked with torch and scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, confusion_matrix, log_loss, precision_score, recall_score

from tasks.errors import EvaluationError
from tasks.judge.evaluate import binary_metrics, evaluate, evaluate_cached, regression_metrics
from tasks.judge.losses import bce_with_logits_loss


def test_classification_metrics_match_torch_and_sklearn(tiny_classifier):
    m = evaluate(tiny_classifier.onnx, tiny_classifier.test_npz, "classification", batch_size=32)
    y, logits = tiny_classifier.y, tiny_classifier.torch_logits
    pred = logits.argmax(axis=1)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    assert m["accuracy"] == pytest.approx(accuracy_score(y, pred))
    assert m["loss"] == pytest.approx(log_loss(y, probs, labels=[0, 1, 2]), rel=1e-5)
    assert m["loss_kind"] == "cross-entropy"  # the task's usual loss when no recipe loss is given
    assert m["confusion_matrix"] == confusion_matrix(y, pred, labels=[0, 1, 2]).tolist()
    assert m["per_class"]["precision"] == pytest.approx(
        precision_score(y, pred, average=None, zero_division=0), abs=1e-6
    )
    assert m["per_class"]["recall"] == pytest.approx(
        recall_score(y, pred, average=None, zero_division=0), abs=1e-6
    )
    assert m["samples"] == 150 and m["model_size_bytes"] == tiny_classifier.onnx.stat().st_size
    assert m["latency_ms_batch1"] > 0 and m["latency_ms_per_sample"] > 0


def test_cached_evaluation_reuses_same_bytes_only(tiny_classifier, tmp_path):
    cache = tmp_path / "cache"
    first = evaluate_cached(tiny_classifier.onnx, tiny_classifier.test_npz, "classification", cache)
    assert len(list(cache.glob("*.json"))) == 1
    again = evaluate_cached(tiny_classifier.onnx, tiny_classifier.test_npz, "classification", cache)
    assert again == first  # measured latencies too: the stored result, not a new run
    other = tmp_path / "other.onnx"  # same model, other bytes (metadata): evaluated anew
    import onnx

    model = onnx.load(str(tiny_classifier.onnx))
    model.doc_string = "retrained"
    onnx.save(model, str(other))
    fresh = evaluate_cached(other, tiny_classifier.test_npz, "classification", cache)
    assert len(list(cache.glob("*.json"))) == 2 and fresh["accuracy"] == first["accuracy"]
    assert fresh["model_size_bytes"] == other.stat().st_size != first["model_size_bytes"]


def test_batch_size_does_not_change_metrics(tiny_classifier):
    a = evaluate(tiny_classifier.onnx, tiny_classifier.test_npz, "classification", batch_size=1)
    b = evaluate(tiny_classifier.onnx, tiny_classifier.test_npz, "classification", batch_size=150)
    assert a["accuracy"] == b["accuracy"] and a["loss"] == pytest.approx(b["loss"], rel=1e-6)


def test_binary_and_regression_metrics():
    z = np.array([2.0, -1.0, 0.5, -3.0])
    t = np.array([1, 0, 0, 1])
    m = binary_metrics(z, t)
    expected = np.mean(
        [np.log1p(np.exp(-2.0)), np.log1p(np.exp(-1.0)), np.log1p(np.exp(0.5)), np.log1p(np.exp(3.0))]
    )
    assert m["accuracy"] == 0.5 and bce_with_logits_loss(z, t) == pytest.approx(expected)
    assert m["confusion_matrix"] == [[1, 1], [1, 1]] and "loss" not in m  # evaluate() adds the loss
    r = regression_metrics(np.array([1.0, 2.0, 4.0]), np.array([1.0, 3.0, 2.0]))
    assert r["mse"] == pytest.approx(5 / 3) and r["mae"] == pytest.approx(1.0)


def test_bad_inputs_name_what_is_wrong(tiny_classifier, tmp_path):
    with pytest.raises(EvaluationError, match="file not found"):
        evaluate(tiny_classifier.onnx, tmp_path / "missing.npz", "classification")
    np.savez(tmp_path / "nolabels.npz", x=tiny_classifier.x)
    with pytest.raises(EvaluationError, match="expected an array 'y'"):
        evaluate(tiny_classifier.onnx, tmp_path / "nolabels.npz", "classification")
    with pytest.raises(EvaluationError, match="task: host evaluation supports"):
        evaluate(tiny_classifier.onnx, tiny_classifier.test_npz, "detection")
    with pytest.raises(EvaluationError, match="expected output 'nope'"):
        evaluate(tiny_classifier.onnx, tiny_classifier.test_npz, "classification", output_name="nope")
    np.savez(tmp_path / "badlabels.npz", x=tiny_classifier.x, y=np.full(150, 7))
    with pytest.raises(EvaluationError, match=r"labels must lie in \[0, 2\]"):
        evaluate(tiny_classifier.onnx, tmp_path / "badlabels.npz", "classification")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(EvaluationError, match="cannot load"):
        evaluate(tmp_path / "junk.onnx", tiny_classifier.test_npz, "classification")
