"""Board environments without root: the --arch/--ort choice, the inventory's ``arch`` and ``runtimes``,
the check verdicts of an autograd-only board, the host's refusal of an ORT-training job before any
upload, and the arm64 environment's own files (cpuinfo, wrapper). The boards themselves (over real
SSH, under qemu) are tests/e2e/test_board_envs.py."""

from __future__ import annotations

import dataclasses
import re
import string
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flows.cli import main
from tasks.board import check_items as ci
from tasks.board.agent import install_agent, no_training_api
from tasks.board.inventory import RUNTIMES, Board, load_inventory, save_board
from tasks.board.transport import connect
from tasks.errors import BoardError, DeviceIncompatible
from tasks.vboard import arm64
from tasks.vboard.boardenv import PLAIN, TRAINING, check_reachable, choose
from tests.fixtures_board import odl_home_env

PLAIN_VERSIONS = ci.plain_versions()
ARM = Board(name="arm", transport="local", root="/nonexistent/odl", arch="aarch64", runtimes=("autograd",))


def test_the_choices_and_their_pins() -> None:
    assert choose() == choose("x86_64", "training") == choose("amd64", "training==1.19.2")
    assert choose().label == "x86_64-onnxruntime-training-1.19.2"
    assert choose("arm64") == choose("arm64", "plain") == choose("aarch64", f"plain=={PLAIN_VERSIONS[0]}")
    assert choose("arm64", "plain").label == f"aarch64-onnxruntime-{PLAIN_VERSIONS[0]}"
    assert len(PLAIN_VERSIONS) >= 2 and PLAIN_VERSIONS[0] == "1.19.2"  # the oldest (X-LINUX-AI's) first
    for version in PLAIN_VERSIONS:
        assert choose("x86_64", f"plain=={version}").version == version
    with pytest.raises(BoardError, match=r"^--ort training: onnxruntime-training has no aarch64 wheel; "):
        choose("arm64", "training")
    with pytest.raises(
        BoardError, match=r"^--ort 'plain==1\.0': expected one of the versions .*: 1\.19\.2, "
    ):
        choose("x86_64", "plain==1.0")
    with pytest.raises(
        BoardError, match=r"^--arch 'riscv64': expected one of aarch64, amd64, arm64, x86_64$"
    ):
        choose("riscv64", "plain")


@settings(max_examples=60, deadline=None)
@given(st.text(st.sampled_from(string.ascii_letters + string.digits + "=.+ -"), max_size=16))
@example("plain==")
@example("")
@example("training==1.19.2")
def test_any_ort_option_is_a_choice_or_one_line_naming_it(text: str) -> None:
    try:
        got = choose("x86_64", text)
    except BoardError as exc:
        assert str(exc).startswith(f"--ort {text!r}: ") and "\n" not in str(exc)
        return
    kind, _, version = text.partition("==")
    assert got.ort == kind and got.ort in (TRAINING, PLAIN)
    assert got.version == (version or got.version) and got.version in [*PLAIN_VERSIONS, "1.19.2"]


@settings(max_examples=40, deadline=None)
@given(
    arch=st.sampled_from(["", "aarch64", "x86_64", "armv7l"]),
    runtimes=st.lists(st.sampled_from(RUNTIMES), unique=True, max_size=len(RUNTIMES)),
)
def test_inventory_keeps_arch_and_runtimes(tmp_path_factory, arch: str, runtimes: list[str]) -> None:
    path = tmp_path_factory.mktemp("inv") / "inventory.toml"
    board = dataclasses.replace(ARM, arch=arch, runtimes=tuple(runtimes))
    save_board(board, path)
    assert load_inventory(path)["arm"] == board
    assert ("runtimes" in path.read_text()) == bool(runtimes) and ("arch" in path.read_text()) == bool(arch)


@pytest.mark.parametrize(
    ("value", "shown"),
    [('["ort", "tflite"]', "['ort', 'tflite']"), ("[]", "[]"), ('"autograd"', "'autograd'")],
)
def test_inventory_refuses_bad_runtimes_naming_the_entry(tmp_path: Path, value: str, shown: str) -> None:
    path = tmp_path / "inventory.toml"
    path.write_text(f'[boards.b1]\ntransport = "local"\nroot = "/x"\nruntimes = {value}\n')
    want = f"{path}: [boards.b1]: key 'runtimes': expected a non-empty list of 'ort-training', 'autograd' (got {shown})"
    with pytest.raises(BoardError, match=f"^{re.escape(want)}$"):
        load_inventory(path)


def test_an_autograd_only_board_passes_the_check_without_the_training_api() -> None:
    ort = {"version": PLAIN_VERSIONS[-1], "training_api": False, "training_api_error": "no api"}
    arm = dataclasses.replace(ARM, ort_version=PLAIN_VERSIONS[-1])
    assert ci.judge_training_api(ort, arm).status == ci.PASS
    assert ci.judge_ort(ort, arm).status == ci.PASS  # a supported plain version, not the training 1.19.2
    unstated = dataclasses.replace(arm, runtimes=())
    assert ci.judge_training_api(ort, unstated).status == ci.FAIL
    assert 'runtime = "autograd"' in ci.judge_training_api(ort, unstated).fix
    assert ci.judge_ort(ort, unstated).status == ci.WARN


def test_ort_job_on_a_board_without_ort_is_refused_before_anything_reaches_it(
    tmp_path: Path, digits_job
) -> None:
    spec, _ = digits_job("no-ort")
    assert spec.runtime == "ort-training"  # the recipe names no runtime: the ORT training one
    board = dataclasses.replace(ARM, root=str(tmp_path / "odl"))
    with connect(board) as conn, pytest.raises(DeviceIncompatible) as err:
        install_agent(conn, board, 0.0, spec.runtime)
    assert str(err.value) == no_training_api("arm", "aarch64")
    assert str(err.value).endswith('no aarch64 wheel; use [training] runtime = "autograd"')
    assert not (tmp_path / "odl").exists()


def test_board_envs_must_be_reachable_by_the_board_user(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(BoardError, match=rf"{closed} is closed to other users \(mode 700\).*ODL_BOARD_ENVS"):
        check_reachable(closed / "board-envs")
    check_reachable(Path("/var/tmp/odl-never-made/board-envs"))  # /, /var and /var/tmp are open to all


def test_arm64_cpuinfo_and_wrapper(tmp_path: Path) -> None:
    arm64.write_cpuinfo(tmp_path / "proc" / "cpuinfo", 3)
    text = (tmp_path / "proc" / "cpuinfo").read_text()
    assert text.count("processor\t:") == 3 and text.count("CPU part\t: 0xd04") == 3  # Cortex-A35
    final, rootfs = Path("/var/tmp/envs/a/bin/python3"), Path("/var/tmp/envs/a/rootfs")
    arm64.write_wrapper(tmp_path / "python3", final, rootfs)
    last = (tmp_path / "python3").read_text().splitlines()[-1]
    assert last == (
        f'exec {arm64.QEMU} -cpu cortex-a35 -0 {final} -L {rootfs} {rootfs}/usr/bin/python3.11 "$@"'
    )
    with pytest.raises(BoardError, match="has a space or quote"):
        arm64.write_wrapper(tmp_path / "python3", Path("/var/tmp/my envs/bin/python3"), rootfs)
    assert arm64.arm64_stamp("2.4.6", "1.19.2") != arm64.arm64_stamp("2.4.6", "1.32.0")


@pytest.mark.parametrize(
    ("args", "want"),
    [(["--arch", "riscv64"], "--arch 'riscv64': expected one of"), (["--arch", "arm64", "--ort", "training"],
     "--ort training: onnxruntime-training has no aarch64 wheel"), (["--ort", "plain==9.9"], "--ort 'plain==9.9'")],
)  # fmt: skip
def test_odl_board_up_refuses_a_wrong_choice_in_one_line(
    tmp_path: Path, capsys, args: list[str], want: str
) -> None:
    with odl_home_env(tmp_path):
        code = main(["board", "up", "--name", "hxnever", *args])
    err = capsys.readouterr().err
    assert code != 0 and want in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "boards").exists()  # refused before the board's folder was made
