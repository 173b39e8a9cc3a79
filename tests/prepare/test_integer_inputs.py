"""Integer inputs (issue 37, item 1): token ids reach an embedding model as int64 through every step,
``model.input_dtype`` says what ``x`` holds and a mismatch is one line naming the field, the dtype
found and the one expected; the board's checks, prefix cache and teacher take the input's dtype."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from device_agent.data.checks import check_dataset
from device_agent.data.prefix_cache import PrefixCache
from device_agent.data.readers import InputSpec, NpzDataset
from device_agent.errors import AgentError
from device_agent.prefix_spec import PrefixSpec
from device_agent.protocol import BlobRef, TeacherSpec
from device_agent.teacher.labels import label_shards, labels_file
from tasks.errors import DataError
from tasks.judge.runtime import run_model
from tasks.prepare.validation.teacher import measure_memory, teacher_outputs
from tasks.recipe.datafiles import check_data_files
from tests.prepare.kit import tiny_recipe

VOCAB, DIM, CLASSES = 12, 4, 3


def _token_model(path, logits: bool = True) -> str:
    """ids [N, L] int64 -> mean of their embeddings [N, DIM] (-> logits [N, CLASSES])."""
    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.standard_normal((VOCAB, DIM)).astype(np.float32), "emb")
    head = numpy_helper.from_array(rng.standard_normal((DIM, CLASSES)).astype(np.float32), "head")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["vectors"]),
             helper.make_node("ReduceMean", ["vectors"], ["feats"], axes=[1], keepdims=0)]  # fmt: skip
    if logits:
        nodes.append(helper.make_node("MatMul", ["feats", "head"], ["logits"]))
    out = helper.make_tensor_value_info("logits" if logits else "feats", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "tokens", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 5])],
                              [out], [emb, head])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _ids(n: int = 10) -> np.ndarray:
    return np.random.default_rng(1).integers(0, VOCAB, (n, 5)).astype(np.int64)


@pytest.mark.parametrize(
    ("dtype", "x_dtype", "error"),
    [
        ("float32", np.int64, "x has dtype int64, expected float32 (model.input_dtype)"),
        ("int64", np.float32, "x has dtype float32, expected int64 (model.input_dtype)"),
        ("int64", np.int32, "x has dtype int32, expected int64 (model.input_dtype)"),
        ("int64", np.int64, None),
        ("int32", np.int32, None),
    ],
)
def test_host_data_check_holds_x_to_the_declared_input_dtype(tmp_path, dtype, x_dtype, error):
    recipe = tiny_recipe(tmp_path, {"model": {"input_shape": [5], "input_dtype": dtype}})
    (tmp_path / "data").mkdir()
    for name in ("train", "test"):
        np.savez(tmp_path / "data" / f"{name}.npz", x=_ids().astype(x_dtype), y=np.zeros(10, np.int64))
    if error is None:
        check_data_files(recipe)
        return
    with pytest.raises(DataError) as caught:
        check_data_files(recipe)
    assert str(caught.value) == f"data.train ({tmp_path / 'data' / 'train.npz'}): {error}"


def test_host_evaluation_feeds_the_inputs_dtype(tmp_path):
    _token_model(tmp_path / "tokens.onnx")
    out, _ = run_model(tmp_path / "tokens.onnx", _ids().astype(np.int32), batch_size=4)
    assert out.shape == (10, CLASSES) and np.isfinite(out).all()


def test_board_check_refuses_float_data_for_token_ids_in_one_line(tmp_path):
    spec = [InputSpec("ids", (None, 5), np.dtype(np.int64))]
    np.savez(tmp_path / "ok.npz", x=_ids())
    check_dataset(NpzDataset(tmp_path / "ok.npz", ["ids"], {"ids": "x"}, "train_data"), spec, "classification", 3,
                  "train_data")  # fmt: skip
    np.savez(tmp_path / "bad.npz", x=_ids().astype(np.float32))
    with pytest.raises(AgentError, match=r"^train_data: input 'ids': expected dtype int64, got float32$"):
        check_dataset(NpzDataset(tmp_path / "bad.npz", ["ids"], {"ids": "x"}, "train_data"), spec,
                      "classification", 3, "train_data")  # fmt: skip


def test_board_prefix_cache_feeds_token_ids_to_its_prefix(tmp_path):
    import onnxruntime as ort

    path = _token_model(tmp_path / "prefix.onnx", logits=False)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.savez(tmp_path / "train.npz", x=_ids().astype(np.int32), y=np.zeros(10, np.int64))
    raw = NpzDataset(tmp_path / "train.npz", ["ids", "y"], {"ids": "x", "y": "y"}, "train_data")
    spec = PrefixSpec(BlobRef("0" * 64, 0), ("ids",), "feats")
    cache = PrefixCache(raw, sess, spec, ["y"], batch=4, budget_mb=64, spill=tmp_path / "spill.npy")
    rows = cache.take(np.arange(10))
    want = sess.run(["feats"], {"ids": _ids()})[0]
    np.testing.assert_array_equal(rows["feats"], want)


def test_board_teacher_labels_token_id_shards(tmp_path):
    _token_model(tmp_path / "teacher.onnx")
    folder = tmp_path / "shards"
    folder.mkdir()
    np.savez(folder / "s1.npz", x=_ids())
    teacher = TeacherSpec(BlobRef("1" * 64, 0), input="x", batch_size=4)
    label_shards(tmp_path / "teacher.onnx", teacher, folder, [folder / "s1.npz"], None)
    stored = np.load(labels_file(folder, teacher, folder / "s1.npz"))
    assert len(stored[stored.files[0]]) == 10


def test_host_teacher_checks_run_a_token_id_teacher(tmp_path):
    _token_model(tmp_path / "teacher.onnx")
    (logits,) = teacher_outputs(tmp_path / "teacher.onnx", _ids(), "")
    assert logits.shape == (10, CLASSES) and np.isfinite(logits).all()
    np.savez(tmp_path / "test.npz", x=_ids())
    assert measure_memory(tmp_path / "teacher.onnx", tmp_path / "test.npz", "x", 4) >= 0


@pytest.mark.parametrize(("dtype", "kind"), [("int64", "i"), ("float32", "f"), ("uint8", "u")])
def test_export_without_data_makes_up_inputs_of_the_declared_dtype(tmp_path, dtype, kind):
    from tasks.prepare.feeds import example_arrays

    recipe = tiny_recipe(tmp_path, {"model": {"input_shape": [5], "input_dtype": dtype}})  # no data made
    (x,) = example_arrays(recipe, ("input",))
    assert x.shape == (2, 5) and x.dtype == np.dtype(dtype) and x.dtype.kind == kind
    if kind != "f":
        assert not x.any()  # id 0: valid for any embedding


def test_token_ids_beyond_the_embedding_are_one_line_naming_the_table(tmp_path):
    from tasks.prepare.validation.data_checks import check_token_ids, embedding_tables
    from tests.prepare.seq_kit import TokenNet, export_module, token_ids

    export_module(TokenNet(vocab=20), tmp_path, token_ids(vocab=20))
    tables = embedding_tables(tmp_path / "model.onnx")
    assert tables == {"input": ("emb.weight", 20)}
    check_token_ids(tables, {"input": "x"}, {"x": token_ids(vocab=20)})
    for bad, got in ((token_ids(vocab=30), "[0, 29]"), (token_ids(vocab=20) - 1, "[-1, 18]")):
        with pytest.raises(DataError) as caught:
            check_token_ids(tables, {"input": "x"}, {"x": bad})
        assert str(caught.value) == (
            f"x holds token ids in {got} for input 'input', but the embedding 'emb.weight' it indexes has 20 "
            "rows (ids 0 to 19)"
        )
