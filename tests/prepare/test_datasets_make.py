"""``[data].make`` never overwrites a user's file and is atomic (issue 34): it writes into a hidden
folder and only what the data folder lacks is moved in; a make killed at any point leaves no
half-made file and the next run makes what is missing; a name the make does not write is one line
naming the field and the nearest existing name. The make here is a tiny module written beside each
recipe (``datamaker:make``) that writes the files of its ``makeplan.json``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasks.errors import DataError, RecipeError
from tasks.exits import HostExit
from tasks.prepare.datasets import ensure_datasets
from tests.prepare.kit import BASE, merge, write_recipe

ROOT = Path(__file__).resolve().parents[2]

DATAMAKER = """
import json, os, signal, time
from pathlib import Path


def make(out_dir):
    here = Path(__file__).parent
    plan = json.loads((here / "makeplan.json").read_text(encoding="utf-8"))
    with open(here / "runs.log", "a") as runs:
        runs.write(f"{os.getpid()}\\n")
    time.sleep(plan.get("sleep", 0))
    for i, (rel, text) in enumerate(plan["files"].items()):
        if i == plan.get("kill_after"):
            os.kill(os.getpid(), signal.SIGKILL)
        path = Path(out_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
"""

# runs ensure_datasets on the recipe given as JSON; "merge": dies right after the first file is moved in
RUNNER = """
import json, os, signal, sys
from pathlib import Path

from tasks.prepare import datasets
from tasks.recipe.load import parse_recipe

folder, when = Path(sys.argv[1]), sys.argv[2]
if when == "merge":
    link = os.link

    def link_then_die(src, dst, **kw):
        link(src, dst, **kw)
        os.kill(os.getpid(), signal.SIGKILL)

    os.link = link_then_die
raw = json.loads((folder / "recipe.json").read_text(encoding="utf-8"))
datasets.ensure_datasets(parse_recipe(raw, folder / "recipe.toml"))
"""


def _kit(folder: Path, files: dict[str, str], **plan) -> None:
    """Write the make module and its plan (relative path -> text) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "datamaker.py").write_text(DATAMAKER)
    (folder / "makeplan.json").write_text(json.dumps({"files": files, **plan}), encoding="utf-8")


def _raw(data: dict | None = None, **tables) -> dict:
    return merge(BASE, {"data": {"make": "datamaker:make", **(data or {})}, **tables})


def _recipe(folder: Path, data: dict | None = None, **tables):
    from tasks.recipe.load import parse_recipe

    return parse_recipe(_raw(data, **tables), folder / "recipe.toml")


def _runs(folder: Path) -> int:
    log = folder / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _user_npz(path: Path, n: int) -> str:
    """A user's own data set of ``n`` samples; its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    np.savez(path, x=rng.standard_normal((n, 1, 4, 4)).astype(np.float32), y=np.zeros(n, np.int64))
    return _sha(path)


def _leftovers(folder: Path) -> list[Path]:
    return sorted(folder.glob(".make-*"))


def test_a_typo_keeps_the_users_train_set_and_names_the_field_with_the_real_name(tmp_path, caplog):
    data = tmp_path / "data"
    own = _user_npz(data / "train.npz", 50)
    _kit(tmp_path, {"train.npz": "generated: 400 samples", "test.npz": "made test", "eval.npz": "made eval"})
    recipe = _recipe(tmp_path, {"test": "data/tset.npz", "eval": "data/eval.npz"})
    for run in (1, 2):  # the typo stays: every run makes again, and keeps the user's file
        with caplog.at_level(logging.INFO, "tasks.prepare.datasets"), pytest.raises(DataError) as err:
            ensure_datasets(recipe)
        line = str(err.value)
        assert "\n" not in line and "recipe field 'data.test'" in line, line
        assert str(recipe.data.test) in line and "(did you mean test.npz?)" in line, line
        assert "datamaker:make did not write it" in line and "eval" not in line, line
        assert _sha(data / "train.npz") == own and _runs(tmp_path) == run
        assert (data / "test.npz").read_text() == "made test" and not _leftovers(data)
    first, second = [r.message for r in caplog.records if "[data].make datamaker:make into" in r.message]
    assert first.endswith(": added eval.npz, test.npz; kept existing: train.npz"), first
    assert second.endswith(": added nothing; kept existing: eval.npz, test.npz, train.npz"), second


def test_a_mistyped_model_onnx_is_a_recipe_error_with_the_nearest_name(tmp_path):
    _kit(tmp_path, {"train.npz": "t", "test.npz": "t", "model.onnx": "an onnx file"})
    model = {"callable": None, "onnx": "data/modle.onnx"}
    with pytest.raises(RecipeError) as err:
        ensure_datasets(_recipe(tmp_path, model=model))
    line = str(err.value)
    assert err.value.field == "model.onnx" and "(did you mean model.onnx?)" in line and "modle.onnx" in line
    assert (tmp_path / "data" / "model.onnx").read_text() == "an onnx file"


def test_without_make_a_missing_file_names_the_field_and_the_nearest_name(tmp_path):
    _user_npz(tmp_path / "data" / "train.npz", 8)
    _user_npz(tmp_path / "data" / "test.npz", 8)
    recipe = _recipe(tmp_path, {"make": None, "eval": "data/qqqq.npz"})
    with pytest.raises(DataError, match=r"^recipe field 'data.eval': .*qqqq.npz does not exist and "
                       r"\[data\].make is not set \(no file of a similar name in .*data\)$"):  # fmt: skip
        ensure_datasets(recipe)
    recipe = _recipe(tmp_path, {"make": None, "eval": "data/tests.npz"})
    with pytest.raises(DataError, match=r"\(did you mean test.npz\?\)$"):
        ensure_datasets(recipe)


def test_a_missing_teacher_model_runs_make_and_keeps_the_rest(tmp_path):
    own = _user_npz(tmp_path / "data" / "test.npz", 50)
    _kit(tmp_path, {"test.npz": "regenerated", "teacher.onnx": "the teacher"})
    data = {"train": None, "board_dataset": "datasets/unlabeled", "test": "data/test.npz"}
    recipe = _recipe(tmp_path, data, teacher={"model": "data/teacher.onnx", "labels": "hard"})
    ensure_datasets(recipe)
    ensure_datasets(recipe)  # nothing missing: no second make
    assert (tmp_path / "data" / "teacher.onnx").read_text() == "the teacher"
    assert _sha(tmp_path / "data" / "test.npz") == own and _runs(tmp_path) == 1


def _run_killed(folder: Path, when: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", RUNNER, str(folder), when], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize("when", ["make", "merge"])
def test_a_killed_make_leaves_no_half_made_file_and_the_next_run_completes(tmp_path, when):
    data = tmp_path / "data"
    own = _user_npz(data / "train.npz", 50)
    files = {"test.npz": "made test", "heldout/shard-0001.npz": "part 1", "train.npz": "generated"}
    files |= {"eval.npz": "made eval", "heldout/shard-0002.npz": "part 2"}
    _kit(tmp_path, files, kill_after=2 if when == "make" else None)
    raw = _raw({"eval": "data/eval.npz"})
    (tmp_path / "recipe.json").write_text(json.dumps(raw))
    done = _run_killed(tmp_path, when)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert len(_leftovers(data)) == 1 and _sha(data / "train.npz") == own
    for path in (p for p in data.rglob("*") if p.is_file() and ".make-" not in str(p)):
        rel = str(path.relative_to(data))
        assert rel in (".make.lock", "train.npz") or path.read_text() == files[rel], rel
    assert not (data / "test.npz").exists() or not (data / "eval.npz").exists()
    _kit(tmp_path, files)  # the next run: no kill
    ensure_datasets(_recipe(tmp_path, {"eval": "data/eval.npz"}))
    assert not _leftovers(data) and _sha(data / "train.npz") == own and _runs(tmp_path) == 2
    assert {str(p.relative_to(data)) for p in data.rglob("*.npz")} == set(files)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_make_folders_of_dead_runs_are_removed_and_live_ones_kept(tmp_path):
    data = tmp_path / "data"
    for name in ("train.npz", "test.npz"):
        _user_npz(data / name, 8)
    dead, live, other = data / f".make-{_dead_pid()}-x1", data / ".make-1-y2", data / ".make-notes"
    for folder in (dead, live, other):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "half.npz").write_text("half")
    _kit(tmp_path, {})
    ensure_datasets(_recipe(tmp_path))  # nothing missing: only the dead run's folder goes
    assert _leftovers(data) == [data / ".make-1-y2", data / ".make-notes"] and _runs(tmp_path) == 0


def test_concurrent_runs_make_once(tmp_path):
    data = tmp_path / "data"
    own = _user_npz(data / "train.npz", 50)
    _kit(tmp_path, {"train.npz": "generated", "test.npz": "made test"}, sleep=1.0)
    (tmp_path / "recipe.json").write_text(json.dumps(_raw()))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), "-"], env=env, cwd=ROOT,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]  # fmt: skip
    errors = [run.communicate(timeout=120)[1] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], errors
    assert _runs(tmp_path) == 1 and _sha(data / "train.npz") == own and not _leftovers(data)
    assert (data / "test.npz").read_text() == "made test"


LOG_LINE = re.compile(r"\d\d:\d\d:\d\d INFO ")  # the command's own progress lines on stderr
LACKING_MAKER = """
from pathlib import Path


def make(out_dir):
    import sibling_the_copy_lacks  # a helper module left out of the recipe folder's copy

    sibling_the_copy_lacks.write(Path(out_dir))
"""


def test_an_exception_in_the_make_is_one_data_error_line_at_the_users_file_and_line(tmp_path):
    """``odl prepare`` of a recipe whose make raises (an import of a module the folder lacks): the
    DataError's status and one line naming the user's file and line; no traceback, no data written."""
    write_recipe(tmp_path, {"data": {"make": "datamaker:make"}})
    (tmp_path / "datamaker.py").write_text(LACKING_MAKER)
    line = next(i for i, t in enumerate(LACKING_MAKER.splitlines(), 1) if "import sibling" in t)
    odl = Path(sys.executable).with_name("odl")
    env = os.environ | {"ODL_HOME": str(tmp_path / "home")}
    argv = [str(odl), "prepare", "recipe.toml", "--out", "out"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    said = [t for t in proc.stderr.splitlines() if not LOG_LINE.match(t)]
    assert proc.returncode == HostExit.DATA == DataError.exit_code, proc.stderr
    assert said == [
        f"odl: error: [data].make datamaker:make raised ModuleNotFoundError at datamaker.py:{line} (in make) "
        "making the data: No module named 'sibling_the_copy_lacks'"
    ], proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [".make.lock"]
    assert not (tmp_path / "out").exists()


FIELDS = ("data.train", "data.test", "data.eval", "model.weights", "data.extra_tests.clean")
TRICKY = ["$(", "$(rm -rf x)", ";", "'", '"', "`", " ", "&&", "|", "*", "é", "中", "😀", "\\", "-"]
stems = st.lists(
    st.one_of(st.sampled_from(TRICKY), st.characters(codec="utf-8", exclude_characters="/\0", exclude_categories=("Cc",))),
    min_size=1, max_size=6,
).map("".join).filter(lambda s: not s.startswith("."))  # fmt: skip
files = st.tuples(
    st.lists(stems, min_size=len(FIELDS), max_size=len(FIELDS), unique=True),
    st.lists(st.booleans(), min_size=len(FIELDS), max_size=len(FIELDS)),  # in the nested folder
    st.lists(st.sampled_from(["existing", "made", "absent"]), min_size=len(FIELDS), max_size=len(FIELDS)),
)
NESTED = "sub dir $(x); 'q'"


@settings(max_examples=40, deadline=None)
@given(files)
@example((["a b", "$(x)", "; rm", "'q\"", "中😀"], [False, True, True, False, True],
          ["existing", "made", "absent", "made", "existing"]))  # fmt: skip
def test_existing_files_stay_made_ones_arrive_and_unmade_ones_are_named(case):
    names, nested, states = case
    nested = [False, *nested[1:]]  # data.train's folder is the one make writes for
    rels = [f"{NESTED}/{n}.npz" if sub else f"{n}.npz" for n, sub in zip(names, nested, strict=True)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = folder / "data"
        own = {}
        for rel, state in zip(rels, states, strict=True):
            if state == "existing":
                (data / rel).parent.mkdir(parents=True, exist_ok=True)
                (data / rel).write_bytes(b"user's own " + rel.encode())
                own[rel] = _sha(data / rel)
        made = {rel: f"made {rel}" for rel, s in zip(rels, states, strict=True) if s != "absent"}
        _kit(folder, {**made, "extra/notes.txt": "unnamed"})
        paths = {field: f"data/{rel}" for field, rel in zip(FIELDS, rels, strict=True)}
        data_table = {"train": paths["data.train"], "test": paths["data.test"], "eval": paths["data.eval"],
                      "extra_tests": {"clean": paths["data.extra_tests.clean"]}}  # fmt: skip
        recipe = _recipe(folder, data_table, model={"weights": paths["model.weights"]})
        absent = [f for f, s in zip(FIELDS, states, strict=True) if s == "absent"]
        try:
            ensure_datasets(recipe)
            assert not absent
        except DataError as exc:
            line = str(exc)
            assert absent and "\n" not in line, line
            assert all(f"recipe field '{f}'" in line for f in absent), line
        assert {rel: _sha(data / rel) for rel in own} == own
        for rel, text in made.items():
            assert rel in own or (data / rel).read_text(encoding="utf-8") == text
        assert not _leftovers(data)
