"""Preparation runs its graphs on the recipe's own data, in a supervised child: a graph that kills
ONNX Runtime (an int64 Div by a count of positive labels that made-up labels leave at 0) stops
``odl prepare`` with one line naming the signal, the stage and the node, and leaves no folder."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from device_agent.data.readers import epoch_permutation
from tasks.errors import HostExit, ModelError
from tasks.exits import Interrupted
from tasks.prepare.feeds import DataSample, graph_feeds, representative
from tasks.prepare.graph import observed_shapes
from tasks.prepare.sandbox.supervise import run_graph, supervised
from tasks.prepare.staging import staged
from tests.prepare.crash_kit import EMPTY_BOARD_BATCH, EMPTY_BOARD_STEP, counting_div_graph, crash_recipe
from tests.prepare.kit import tiny_recipe, write_recipe

SIGFPE_LINE = "ONNX Runtime died of SIGFPE (an arithmetic fault: an integer division or remainder by zero)"


def _labelled(positive: bool) -> DataSample:
    labels = np.array([[0, 1, 0, 2], [2, 0, 0, 0]] if positive else np.zeros((2, 4)), np.int64)
    return DataSample({"x": np.full((2, 4), 3.0, np.float32), "y": labels}, "data.train", {"labels": "y"})


def test_the_smallest_crashing_graph_runs_on_data_and_dies_on_zero_labels_in_one_line():
    model = counting_div_graph()
    with supervised("artifacts") as stage:
        got = run_graph(model, graph_feeds(model, 2, _labelled(True)), "testing")
        first_child = stage.child.proc.pid
        assert int(got["ratio"]) == 24 // 3  # sum(x) = 24 over 3 positive labels
        assert run_graph(model, graph_feeds(model, 2, _labelled(True)), "testing again")
        assert stage.child.proc.pid == first_child  # one child serves the stage's runs
        with pytest.raises(ModelError) as err:
            run_graph(model, graph_feeds(model, 2, _labelled(False)), "measuring every tensor's shape")
        assert int(run_graph(model, graph_feeds(model, 2, _labelled(True)), "after")["ratio"]) == 8
    assert str(err.value) == (
        f"{SIGFPE_LINE} in the artifacts stage while measuring every tensor's shape on 2 samples of data.train; "
        "the first node whose run dies is '/loss/Div' (Div, layer loss): its integer divisor is 0 for these "
        "inputs: keep what the model divides by at least 1 (e.g. clamp(min=1)) in its code"
    )


def test_threads_outside_a_stage_share_the_process_child_one_request_at_a_time():
    model = counting_div_graph()
    feeds = graph_feeds(model, 2, _labelled(True))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: int(run_graph(model, feeds, "in a thread")["ratio"]), range(12)))
    assert got == [8] * 12


def _embedding_with_positions() -> onnx.ModelProto:
    """Token and position embeddings (the positions a Range over the ids' length) under a
    LayerNorm: ONNX Runtime fuses them into EmbedLayerNormalization and gives the Range, asked
    for as an output, back as None."""
    rng = np.random.default_rng(0)
    tables = [onnx.numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
              for n, s in (("word", (10, 8)), ("pos", (4, 8)), ("scale", (8,)), ("bias", (8,)))]  # fmt: skip
    consts = [helper.make_node("Constant", [], [n], value=helper.make_tensor(n, TensorProto.INT64, [], [v]))
              for n, v in (("zero", 0), ("one", 1))]  # fmt: skip
    nodes = [*consts, helper.make_node("Shape", ["ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
             helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
             helper.make_node("Gather", ["word", "ids"], ["w"]), helper.make_node("Gather", ["pos", "positions"], ["p"]),
             helper.make_node("Add", ["w", "p"], ["e"]),
             helper.make_node("LayerNormalization", ["e", "scale", "bias"], ["y"], axis=-1)]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8])], tables)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_shape_probe_keeps_the_inferred_shape_of_a_tensor_onnx_runtime_fused_away():
    shapes = observed_shapes(_embedding_with_positions())  # was: the child died of exit status 1
    assert shapes["y"] == [2, 4, 8] and shapes["e"] == [2, 4, 8]
    assert shapes["positions"] == [-1]  # inferred (a length unknown before a run), not measured


_DTYPES = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.FLOAT16: np.float16}


@st.composite
def _input_and_data(draw):
    """A declared graph input (rank, static or symbolic dims, dtype) and data of a fitting or clashing shape."""
    rank = draw(st.integers(1, 3))
    dims = draw(st.lists(st.one_of(st.none(), st.integers(1, 3)), min_size=rank, max_size=rank))
    elem = draw(st.sampled_from(sorted(_DTYPES)))
    rows = draw(st.integers(1, 4))
    fits = draw(st.booleans())
    shape = [rows] + [d if (d is not None and fits) else draw(st.integers(1, 3)) for d in dims[1:]]
    data = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1
    return dims, elem, data


@settings(max_examples=60, deadline=None)
@given(_input_and_data(), st.integers(1, 4))
@example(([None, 2], TensorProto.INT64, np.ones((1, 3))), 2)  # a sample shape the graph does not declare
def test_graph_feeds_take_the_datas_rows_at_the_declared_dtype_or_zeros(case, batch):
    dims, elem, data = case
    graph = helper.make_graph([helper.make_node("Identity", ["in"], ["out"])], "g",
                              [helper.make_tensor_value_info("in", elem, [d or "n" for d in dims])],
                              [helper.make_tensor_value_info("out", elem, None)])  # fmt: skip
    feeds = graph_feeds(helper.make_model(graph), batch, DataSample({"x": data}, "data.train"))
    fed = feeds.arrays["in"]
    assert fed.dtype == _DTYPES[elem]
    assert len(fed) == (dims[0] or batch)
    assert all(d is None or d == got for d, got in zip(dims[1:], fed.shape[1:], strict=True))
    fits = all(d is None or d == got for d, got in zip(dims[1:], data.shape[1:], strict=True))
    if fits:  # each row is a row of the data (repeated when it has fewer), cast
        want = data[np.arange(len(fed)) % len(data)].astype(_DTYPES[elem])
        assert np.array_equal(fed, want) and feeds.origin == f"{batch} samples of data.train"
    else:
        assert not fed.any() and "all-zero" in feeds.origin


def test_a_stop_signal_inside_a_staged_build_leaves_no_partial_folder(tmp_path):
    with pytest.raises(Interrupted), staged(tmp_path / "out") as work:
        (work / "model.onnx").write_text("half")
        raise Interrupted(15)
    assert list(tmp_path.iterdir()) == []


def _odl(folder: Path, *args: str) -> subprocess.CompletedProcess:
    odl = Path(sys.executable).with_name("odl")
    env = os.environ | {"ODL_HOME": str(folder / "home")}
    return subprocess.run([str(odl), *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def prepared_crash(tmp_path_factory):
    """``odl prepare`` of the recipe whose loss divides by its positive labels (in a child: before the
    feeds came from the data, its shape probe killed the preparing process)."""
    folder = tmp_path_factory.mktemp("counted")
    write_recipe(folder, crash_recipe(folder))
    return folder, _odl(folder, "prepare", "recipe.toml", "--out", "out")


def test_a_loss_dividing_by_its_positive_labels_prepares_with_the_recipes_data(prepared_crash):
    folder, proc = prepared_crash
    assert proc.returncode == 0, proc.stderr
    assert "validation passed" in proc.stdout and (folder / "out" / "manifest.json").is_file()


def test_forced_onto_zero_labels_its_shape_probe_stops_in_one_line_naming_signal_stage_and_node(
    prepared_crash,
):
    folder, _ = prepared_crash
    model = onnx.load(str(folder / "out" / "model.onnx"))
    recipe = tiny_recipe(folder, crash_recipe(folder))
    with supervised("artifacts", recipe):
        assert observed_shapes(model)["logits"] == [2, 16, 3]  # the recipe's labels: it runs
    with pytest.raises(ModelError) as err, supervised("artifacts"):
        observed_shapes(model)  # no data: all-zero labels
    assert str(err.value).startswith(
        f"{SIGFPE_LINE} in the artifacts stage while measuring every tensor's shape at batch 2 on all-zero "
        "inputs (no data file); the first node whose run dies is '/Div' (Div): its integer divisor is 0"
    ), err.value
    with representative(recipe), pytest.raises(ModelError, match="SIGFPE"), supervised("export"):
        zero_labels = DataSample(
            {"x": np.ones((2, 1, 4, 4), np.float32), "y": np.zeros((2, 16), np.int64)}, "t"
        )
        run_graph(model, graph_feeds(model, 2, zero_labels), "checking the batch")


def test_a_batch_without_positives_stops_odl_prepare_in_one_line_and_leaves_no_folder(tmp_path):
    """The probe trains on the recipe's data; its second batch has no positive label, so the board
    would die: the line names the signal, the check, the rows and the node."""
    write_recipe(tmp_path, crash_recipe(tmp_path, {"data": {"make": "crashmodels:make_empty_batch"}}))
    proc = _odl(tmp_path, "prepare", "recipe.toml", "--out", "out")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("odl: ")]
    assert proc.returncode == HostExit.VALIDATION and "Traceback" not in proc.stderr and len(lines) == 1, (
        proc.stderr
    )
    assert lines[0].startswith(
        "odl: error: validation check 'train_step' failed: the training probe was killed by SIGFPE (an "
        "arithmetic fault: an integer division or remainder by zero) inside ONNX Runtime during the train step "
        "check; run alone on that batch (rows 16-31 of train.npz), the model's own graph dies first at '/Div' (Div)"
    ), lines[0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]


def test_a_batch_of_the_boards_second_epoch_without_positives_stops_odl_prepare_naming_step_and_samples(
    tmp_path,
):
    """Issue 53: the board died of SIGFPE at a step whose batch has no positive label, though
    validation had passed. Here neither the probe's batches (rows in order) nor any batch of the
    board's first epoch lacks one, but the 3rd batch of its second epoch (its shuffle) does:
    validation runs every batch the board will, in its order, and names that one."""
    write_recipe(tmp_path, crash_recipe(tmp_path, EMPTY_BOARD_BATCH))
    proc = _odl(tmp_path, "prepare", "recipe.toml", "--out", "out")
    with np.load(tmp_path / "data" / "train.npz") as npz:
        positive = (npz["y"] > 0).any(axis=1)
    first, second = (epoch_permutation(0, epoch, len(positive)) for epoch in (0, 1))
    assert all(positive[k : k + 16].any() and positive[first[k : k + 16]].any() for k in range(0, 64, 16))
    empty = second[(EMPTY_BOARD_STEP - 5) * 16 :][:16]
    assert not positive[empty].any()
    lines = [line for line in proc.stderr.splitlines() if line.startswith("odl: ")]
    assert proc.returncode == HostExit.VALIDATION and len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "odl: error: validation check 'board_batches' failed: the training probe was killed by SIGFPE (an "
        "arithmetic fault: an integer division or remainder by zero) inside ONNX Runtime during the board batches "
        f"check; the board would die on its batch at step {EMPTY_BOARD_STEP} (epoch 2): samples "
        f"[{', '.join(map(str, empty))}] of train.npz (16 in the batch); run alone on it, the model's own graph "
        "dies first at '/Div' (Div): its integer divisor is 0"
    ), lines[0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]


def test_the_separate_stages_feed_the_recipes_data_too(prepared_crash):
    """``odl export`` then ``odl artifacts`` then ``odl validate``, as a user steps through them: the
    artifacts stage's graph runs take the recipe's labels as ``odl prepare`` does (on zeros its
    shape probe died of SIGFPE)."""
    folder, _ = prepared_crash
    for args in (("export",), ("artifacts", "--model", "staged/model.onnx"), ("validate",)):
        proc = _odl(folder, args[0], "recipe.toml", "--out", "staged", *args[1:])
        assert proc.returncode == 0, (args, proc.stderr)
        assert "SIGFPE" not in proc.stderr
    assert (folder / "staged" / "manifest.json").is_file()
