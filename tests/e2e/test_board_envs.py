"""Board environments with a plain onnxruntime, on x86_64 and on aarch64 (qemu user mode), over real SSH.

Each supported plain onnxruntime version (``deploy/board-requirements-plain.txt``) on each
architecture: the board reports its machine, its onnxruntime and no training API, through
``odl board check`` and ``odl board info``; an ORT-training job is refused in one line before anything
reaches the board; an InferenceSession on the board gives the host's numbers; an autograd-runtime
job trains there with the losses of the host's replay (the oldest version and the newest, on x86_64;
aarch64's run is tests/e2e/test_arm64_autograd.py's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from flows.cli import main
from tasks.board.agent import agent_argv
from tasks.board.check import check_board, exit_code
from tasks.board.check_items import PASS, plain_versions
from tasks.board.inventory import Board
from tasks.board.run import drive_job
from tasks.board.transport import connect
from tasks.errors import DeviceIncompatible
from tasks.stages.board import deploy
from tests.fixtures_board import odl_home_env, session_board

pytestmark = [pytest.mark.board, pytest.mark.slow]

MACHINES = {"x86_64": "x86_64", "arm64": "aarch64"}
DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "digits.toml"
ENVS = [(arch, version) for arch in MACHINES for version in plain_versions()]
CASES = 6  # random models per board, all run by one board process
RUN_MODELS = r"""
import json, sys
import numpy as np, onnxruntime as ort
out = {}
for path in sys.argv[1:]:
    feeds = dict(np.load(path + ".npz"))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out[path.rsplit("/", 1)[-1]] = [o.astype(np.float64).ravel().tolist() for o in sess.run(None, feeds)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=ENVS, ids=[f"{MACHINES[a]}-onnxruntime-{v}" for a, v in ENVS])
def plain_board(request: pytest.FixtureRequest, virtual_board_home: Path) -> Iterator[Board]:
    """A board of each architecture and plain onnxruntime version (the session's arm64 board for the default)."""
    arch, version = request.param
    if (arch, version) == ("arm64", plain_versions()[0]):
        yield request.getfixturevalue("arm64_board")
        return
    name = f"p{os.getpid() % 100000}{ENVS.index(request.param)}"
    with session_board(virtual_board_home, name, arch=arch, ort=f"plain=={version}") as board:
        yield board


def test_board_reports_machine_ort_and_no_training_api(
    plain_board: Board, virtual_board_home: Path, capsys
) -> None:
    machine = plain_board.arch
    assert machine in MACHINES.values() and plain_board.runtimes == ("autograd",)
    checks = {c.name: c for c in check_board(plain_board)}  # what `odl board check NAME` prints
    assert exit_code(list(checks.values())) == 0, [c.line() for c in checks.values()]
    assert checks["python"].value.endswith(f", {machine})")
    assert checks["onnxruntime"].status == PASS and checks["onnxruntime"].value.startswith(
        plain_board.ort_version
    )
    assert checks["training-api"].status == PASS and checks["training-api"].value.startswith("absent")
    with odl_home_env(virtual_board_home):
        assert main(["board", "info", plain_board.name]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["machine"], info["ort_version"], info["training_api"]) == (
        machine,
        plain_board.ort_version,
        False,
    )
    assert "has no training API" in info["training_api_error"] and info["torch_loaded"] is False
    with connect(plain_board) as conn:  # the agent's own exit: 0, the board runs the autograd runtime
        assert conn.run(agent_argv(plain_board, "info"), check=False).code == 0


def test_inference_session_on_the_board_gives_the_hosts_numbers(plain_board: Board, tmp_path: Path) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(20240536)
    paths = [_random_model(rng, tmp_path / f"m{i}.onnx") for i in range(CASES)]
    remote = posixpath.join(posixpath.dirname(plain_board.root), f"onnx-cases-{os.getpid()}")
    with connect(plain_board) as conn:
        conn.run(["mkdir", "-p", remote])
        for path in paths:
            conn.put(path, posixpath.join(remote, path.name))
            conn.put(Path(f"{path}.npz"), posixpath.join(remote, f"{path.name}.npz"))
        res = conn.run(
            [plain_board.python, "-c", RUN_MODELS, *(posixpath.join(remote, p.name) for p in paths)]
        )
        conn.run(["rm", "-rf", remote])
    board = json.loads(res.stdout.strip().splitlines()[-1])
    for path in paths:
        feeds = dict(np.load(f"{path}.npz"))
        host = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        for want, got in zip(host, board[path.name], strict=True):
            diff = np.max(np.abs(want.astype(np.float64).ravel() - np.asarray(got)))
            assert diff <= 1e-6, f"{path.name} on {plain_board.arch}: largest difference {diff:.3g}"


def test_ort_training_job_is_refused_in_one_line_before_any_upload(arm64_board: Board, digits_job) -> None:
    spec, files = digits_job("arm64-refused")
    want = (f"board {arm64_board.name} (aarch64) has no onnxruntime training API: onnxruntime-training has no "
            'aarch64 wheel; use [training] runtime = "autograd"')  # fmt: skip
    fresh = dataclasses.replace(
        arm64_board, root=posixpath.join(posixpath.dirname(arm64_board.root), "odl-refused")
    )
    with pytest.raises(DeviceIncompatible) as err:
        deploy(fresh, spec, files)  # the inventory says: runtimes = ["autograd"]
    assert str(err.value) == want
    unstated = dataclasses.replace(fresh, runtimes=())  # an entry that does not say: the agent's info does
    with connect(unstated) as conn:
        assert not conn.exists(fresh.root)  # nothing reached the board, not even the agent
        with pytest.raises(DeviceIncompatible) as err:
            drive_job(conn, unstated, spec, files)
        assert str(err.value) == want
        assert conn.run(["ls", "-A", fresh.root]).stdout.split() == ["agent"]  # no blobs/, no jobs/
        conn.run(["rm", "-rf", fresh.root])


@pytest.fixture(scope="module")
def autograd_job(virtual_board_home: Path, tmp_path_factory: pytest.TempPathFactory):
    """The digits recipe under the autograd runtime, one epoch (13 steps), and its losses replayed by
    the agent on this host (x86_64, the oldest plain onnxruntime): (spec, files, step -> loss)."""
    from tasks.recipe.load import load_recipe
    from tasks.stages.prepare import inputs, job_spec, prepare
    from tasks.vboard.boardenv import choose, ensure_env
    from tests.fixtures_board import BOARD_ENVS

    with odl_home_env(virtual_board_home):
        recipe = load_recipe(DIGITS, {"training.runtime": "autograd"})
        inp = inputs(recipe)
        spec, files = job_spec(inp, prepare(inp), f"autograd-envs-{os.getpid()}")
    train = dataclasses.replace(spec.train, epochs=1, log_every=1, checkpoint_every=0)
    spec = dataclasses.replace(spec, train=train, eval_data=None)
    folder = tmp_path_factory.mktemp("replay")
    python = ensure_env(choose("x86_64", "plain"), folder / "unused", BOARD_ENVS).python
    host = Board(name="replay", transport="local", root=str(folder / "odl"), python=python)
    events: list = []
    with connect(host) as conn:
        drive_job(conn, host, spec, files, events.append)
    return spec, files, _step_losses((e.type, e.data) for e in events)


def test_an_autograd_job_trains_on_the_board_with_the_losses_of_the_hosts_replay(
    plain_board: Board, autograd_job
) -> None:
    if plain_board.arch == "aarch64":  # 50x slower under qemu: one aarch64 training run in the suite
        pytest.skip("aarch64 trains through odl/full with its replay in tests/e2e/test_arm64_autograd.py")
    spec, files, host = autograd_job
    events: list = []
    with connect(plain_board) as conn:
        _, result = drive_job(conn, plain_board, spec, files, events.append)
    assert result.status == "finished" and result.versions["machine"] == plain_board.arch
    assert result.versions["onnxruntime"] == plain_board.ort_version
    board = _step_losses((e.type, e.data) for e in events)
    both = board.keys() & host.keys()  # step events are thinned by time: the steps both reported
    assert len(both) >= 3 and max(both) == result.steps == 13, (sorted(board), sorted(host))
    worst = max(abs(board[k] - host[k]) / abs(host[k]) for k in both)
    print(f"{plain_board.arch}, onnxruntime {plain_board.ort_version}: {len(both)} step losses, largest "
          f"relative difference to the host's replay {worst:.2g}")  # fmt: skip
    assert worst <= 1e-4, f"{plain_board.arch}, onnxruntime {plain_board.ort_version}: {worst:.3g}"


def _step_losses(events) -> dict[int, float]:
    return {int(d["step"]): float(d["loss"]) for kind, d in events if kind == "step" and "loss" in d}


def _random_model(rng: np.random.Generator, path: Path) -> Path:
    """A small random CNN (conv of random stride, padding, dilation and groups, BatchNorm, HardSwish,
    a transposed conv, pooling, Gemm, Softmax) with its input in ``path.npz``; returns ``path``."""
    groups = int(rng.choice([1, 2, 4]))
    cin, cout = 4, 4 * int(rng.integers(1, 3))
    kernel, stride, dil = int(rng.choice([1, 3])), int(rng.integers(1, 3)), int(rng.integers(1, 3))
    size = int(rng.integers(8, 13))
    w = {
        "w1": rng.normal(0, 0.3, (cout, cin // groups, kernel, kernel)),
        "b1": rng.normal(0, 0.1, cout),
        "scale": rng.uniform(0.5, 1.5, cout), "bias": rng.normal(0, 0.1, cout),
        "mean": rng.normal(0, 0.1, cout), "var": rng.uniform(0.5, 1.5, cout),
        "wt": rng.normal(0, 0.3, (cout, 2, 2, 2)),
        "wg": rng.normal(0, 0.3, (2, 3)), "bg": rng.normal(0, 0.1, 3),
    }  # fmt: skip
    pad = dil * (kernel // 2)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], group=groups, strides=[stride] * 2,
                         dilations=[dil] * 2, pads=[pad] * 4),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
        helper.make_node("HardSwish", ["n"], ["h"]),
        helper.make_node("ConvTranspose", ["h", "wt"], ["t"], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["t"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["g"]),
        helper.make_node("Softmax", ["g"], ["y"]),
        helper.make_node("ReduceMean", ["t"], ["s"], keepdims=0),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "case", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]), helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    np.savez(f"{path}.npz", x=rng.normal(0, 1, (2, cin, size, size)).astype(np.float32))
    return path
