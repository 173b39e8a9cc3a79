"""``odl prepare`` builds in a temporary sibling folder and renames it into place only when every
step passed: a failed prepare leaves nothing behind and an earlier prepared folder intact."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main
from tasks.errors import HostExit, ModelError, RecipeError
from tasks.prepare.pipeline import inputs, prepare, step_done
from tasks.prepare.staging import PREPARED_MARK, remove_stale, staged
from tests.prepare.kit import write_recipe


def _odl_prepare(recipe, out, capsys) -> tuple[int, str]:
    code = main(["prepare", str(recipe.source), "--out", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, "\n".join(line for line in err.splitlines() if line.startswith("odl: "))


def _left(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".out", "out")))


@pytest.fixture
def recipe_file(tmp_path):
    """Write the tiny recipe (with ``changes``) as tmp_path/recipe.toml and return it parsed."""
    from tasks.recipe.load import load_recipe

    return lambda changes=None: load_recipe(write_recipe(tmp_path, changes))


FAILURES = {
    "corrupt ONNX": ({"model": {"callable": None, "onnx": "broken.onnx"}}, HostExit.MODEL),
    "pattern matching nothing": (
        {"trainable": {"strategy": None, "patterns": ["nothing*"]}},
        HostExit.RECIPE,
    ),
    "NaN data": ({"data": {"make": "tinymodels:make_nan"}}, HostExit.DATA),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failed_prepare_leaves_no_folder(case, tmp_path, recipe_file, capsys):
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx file")
    changes, code = FAILURES[case]
    recipe = recipe_file(changes)
    got, err = _odl_prepare(recipe, tmp_path / "out", capsys)
    assert got == code and err.count("\n") == 0, err
    assert _left(tmp_path) == []


def test_a_good_prepare_replaces_an_earlier_one_and_a_failed_one_keeps_it(tmp_path, recipe_file, capsys):
    recipe = recipe_file()
    assert _odl_prepare(recipe, tmp_path / "out", capsys)[0] == 0
    first = (tmp_path / "out" / "manifest.json").read_text()
    (tmp_path / "out" / "stale.txt").write_text("from an earlier prepare")
    assert _odl_prepare(recipe, tmp_path / "out", capsys)[0] == 0
    assert not (tmp_path / "out" / "stale.txt").exists()  # replaced as a whole, not written over
    second = (tmp_path / "out" / "manifest.json").read_text()
    assert first != "" and second != ""
    bad = recipe_file({"optimizer": {"kind": "sgd", "lr": 1e-30}})  # the loss cannot fall
    assert _odl_prepare(bad, tmp_path / "out", capsys)[0] == HostExit.VALIDATION
    assert (tmp_path / "out" / "manifest.json").read_text() == second and _left(tmp_path) == ["out"]


def test_a_folder_of_other_files_is_refused_untouched(tmp_path, recipe_file, capsys):
    recipe = recipe_file()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    code, err = _odl_prepare(recipe, tmp_path / "out", capsys)
    assert code == HostExit.PIPELINE and "not a prepared recipe" in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    "runtime", ["autograd", pytest.param("ort-training", marks=pytest.mark.ort_training)]
)
def test_labels_outside_the_models_classes_stop_the_real_cli_with_exit_55(tmp_path, runtime):
    """The recipe gives no num_classes (the model takes it as a keyword): the exported model's 3
    outputs bound the labels, as on the board. ``odl prepare`` (the installed command, in a child
    process) exits 55 with one line naming the field and file under either runtime, before any
    training step is built or run (under autograd the step's loss indexed past the classes inside
    ONNX Runtime and the stop blamed the runtime), and leaves no folder."""
    changes = {"model": {"num_classes": None, "kwargs": {"num_classes": 3}}, "training": {"runtime": runtime}}
    write_recipe(tmp_path, changes | {"trainable": {"strategy": "last-conv+classifier"}})
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    train = tmp_path / "data" / "train.npz"
    np.savez(
        train, x=rng.standard_normal((32, 1, 4, 4)).astype(np.float32), y=np.arange(32, dtype=np.int64) % 13
    )
    np.savez(tmp_path / "data" / "test.npz", x=rng.standard_normal((8, 1, 4, 4)).astype(np.float32),
             y=np.arange(8, dtype=np.int64) % 3)  # fmt: skip
    odl = Path(sys.executable).with_name("odl")
    env = os.environ | {"ODL_HOME": str(tmp_path / "home")}
    argv = [str(odl), "prepare", "recipe.toml", "--out", "out"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("odl: ")]
    assert proc.returncode == HostExit.DATA == 55, proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0] == (
        f"odl: error: data.train ({train}): y has labels in [0, 12], expected [0, 2] (num_classes = 3)"
    )
    for runtime_text in ("onnxruntime", "ONNXRuntimeError", "traced", "rehearsing"):
        assert runtime_text not in proc.stderr, proc.stderr  # no step built or run, no advice rehearsed
    assert _left(tmp_path) == []


def test_the_folder_has_the_umasks_mode_and_errors_name_it_not_the_sibling(tmp_path):
    folder = tmp_path / "out"
    with staged(folder) as work:
        (work / PREPARED_MARK).write_text("{}")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~mask  # not mkdtemp's 0700
    with pytest.raises(ModelError) as info, staged(folder) as work:
        raise ModelError(f"{work / 'model.onnx'} is not a valid ONNX model")
    assert str(info.value) == f"{folder / 'model.onnx'} is not a valid ONNX model"
    assert (folder / PREPARED_MARK).read_text() == "{}" and _left(tmp_path) == ["out"]


def test_what_a_killed_prepare_left_is_removed_by_the_next(tmp_path):
    gone = subprocess.Popen(["true"])  # noqa: S607 - a pid whose process has ended
    gone.wait()
    left = {tmp_path / f".out.partial-{gone.pid}-0badc0de", tmp_path / f".out.old-{gone.pid}-0badc0de"}
    running = tmp_path / f".out.partial-{os.getpid()}-0badc0de"  # a build still under way: kept
    for path in [*left, running]:
        path.mkdir()
    assert set(remove_stale(tmp_path / "out")) == left
    assert not any(p.exists() for p in left) and running.exists()


def test_a_failed_cached_build_leaves_no_folder_and_a_complete_one_is_reused(
    tmp_path, recipe_file, monkeypatch
):
    """``cache=True`` (``odl run``, the flow) builds in ``$ODL_HOME/prepared/<recipe>-<hash12>``:
    a build that fails there removes the folder it started; a completed one is reused step by step."""
    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    bad = recipe_file({"trainable": {"strategy": None, "patterns": ["nothing*"]}})
    with pytest.raises(RecipeError):
        prepare(bad, cache=True, validate=False)
    assert list((tmp_path / "home").glob("prepared/*")) == []
    good = inputs(recipe_file())
    first = prepare(good, cache=True, validate=False)
    assert first.out_dir == good.folder and step_done(good, "artifacts")
    stamp = first.model_onnx.stat().st_mtime_ns
    assert prepare(good, cache=True, validate=False).model_onnx.stat().st_mtime_ns == stamp
