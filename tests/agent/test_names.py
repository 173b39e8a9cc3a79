"""The one name rule (``device_agent.names``): generated names built from shell and path
metacharacters against a plain restatement of the rule, the shell and path readings of every name
it accepts, and the agent's own commands giving the rule's answer without touching the root."""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
import shlex
import string
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings

from device_agent.cli import main as agent_main
from device_agent.names import NAME_ALLOWED, refusal
from device_agent.protocol import (
    BOARD_PATH_ALLOWED,
    NAME,
    BadName,
    ExitCode,
    SpecError,
    board_path_ok,
    valid_job_id,
)
from tests.agent.names_kit import ALPHABET, evil, good, mixed, tree


def spec_name(value: str) -> bool:
    """The rule as the README states it, without its regex."""
    return (
        0 < len(value) <= NAME.max_len
        and set(value) <= set(ALPHABET)
        and value[0] in string.ascii_letters + string.digits
        and ".." not in value
    )


def misread(value: str) -> bool:
    """Whether a shell line or a path join could read ``value`` as something else than one name."""
    joined = posixpath.normpath(posixpath.join("/root", value))
    return (
        shlex.quote(value) != value
        or shlex.split(value, comments=True) != [value]
        or value.startswith("-")
        or joined != f"/root/{value}"
        or posixpath.basename(joined) != value
        or not value.isprintable()
    )


@settings(max_examples=2000, deadline=None)
@given(mixed)
@example("job\n")  # the old job id regex's '$' took a trailing newline
@example("a..b")
@example("a.")
@example("\uff0e\uff0e")
def test_the_rule_is_its_plain_statement_and_nothing_it_accepts_is_misread(value: str) -> None:
    assert NAME.ok(value) == spec_name(value)
    if NAME.ok(value):
        assert not misread(value), value
    assert NAME.path_ok(value) == (len(value) <= 255 and all(spec_name(part) for part in value.split("/")))


@settings(max_examples=500, deadline=None)
@given(evil)
def test_every_metacharacter_name_is_refused_with_one_line(value: str) -> None:
    assert not NAME.ok(value)
    with pytest.raises(BadName) as info:
        NAME.check(value, "field", source="f.toml", entry="e\nx")
    line = str(info.value)
    assert "\n" not in line and "\0" not in line and line.isprintable()
    assert line == refusal("field", value, NAME_ALLOWED, "f.toml", "e\nx")
    assert line.startswith("field (f.toml entry 'e\\nx'): ") and line.endswith(
        f"is not a valid name: {NAME_ALLOWED}"
    )


@settings(max_examples=500, deadline=None)
@given(good)
def test_every_name_of_the_alphabet_is_accepted(value: str) -> None:
    assert NAME.check(value, "x") == value and valid_job_id(value) == value
    assert NAME.check_path(f"datasets/{value}/{value}", "x") == f"datasets/{value}/{value}"


def test_job_ids_board_paths_and_absolute_paths() -> None:
    for bad in ("job\n", "../x", "a/b", "-x", ".x", ""):
        try:
            valid_job_id(bad)
        except SpecError as exc:  # a BadName is a SpecError: job.json parsing names the field
            assert exc.field == "job_id" and "is not a valid name" in str(exc)
        else:
            raise AssertionError(bad)
    assert board_path_ok("/data/cam") and board_path_ok("datasets/cam/night1")
    for bad in ("/data/../etc", "datasets/../x", "datasets//x", "datasets/x/", "a\0b", "/a\nb", ""):
        assert not board_path_ok(bad), bad
    assert not NAME.path_ok("/etc/cron.d")  # a destination is never absolute, never rebased


def agent(root: Path, *args: str, stdin: bytes = b"") -> tuple[int, dict]:
    """Run one agent command in this process; its exit code and last JSON line."""
    out = io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = agent_main(["--root", str(root), *args])
    finally:
        sys.stdin = old_stdin
    return code, json.loads(out.getvalue().strip().splitlines()[-1])


@settings(max_examples=150, deadline=None)
@given(mixed)
@example("x;touch MARK")
@example("$(touch MARK)")
@example("a\nb")
def test_agent_commands_answer_as_the_rule_and_touch_nothing_when_they_refuse(value: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = base / "odl"
        (root / "datasets").mkdir(parents=True)
        calls = [  # (argv, field, the rule's answer, what the refusal says is allowed)
            (["models", value], "recipe", NAME.ok(value), NAME.allowed),
            (["add-file", "datasets", value], "name", NAME.ok(value), NAME.allowed),
            (["add-file", value, "f.npz"], "folder", NAME.path_ok(value), NAME.path_allowed),
        ]
        if not value.startswith("/"):  # an absolute folder to read is the board's own
            calls.append((["dataset", value], "path", NAME.path_ok(value), BOARD_PATH_ALLOWED))
        for argv, field, ok, allowed in calls:
            before = tree(base)
            code, answer = agent(root, argv[0], "--", *argv[1:], stdin=b"shard")  # "--": "-x" is no option
            if ok:  # a dataset folder that is not there yet: DATA_MISMATCH
                assert code in (ExitCode.OK, ExitCode.DATA_MISMATCH), (argv, answer)
                continue
            assert code == ExitCode.INVALID_ARGUMENT, (argv, answer)
            assert answer["error"] == refusal(field, value, allowed)
            assert tree(base) == before, argv
        assert not (Path.cwd() / "MARK").exists()


def test_add_file_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "odl", tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    (root / "datasets").symlink_to(outside)
    code, answer = agent(root, "add-file", "datasets/cam", "f.npz", stdin=b"shard")
    assert code == ExitCode.INVALID_ARGUMENT and "symbolic link" in answer["error"]
    assert list(outside.iterdir()) == []


def test_add_file_appends_once_and_never_rewrites(tmp_path: Path) -> None:
    root = tmp_path / "odl"
    code, first = agent(root, "add-file", "datasets/cam/night1", "f.npz", stdin=b"shard")
    assert code == 0 and first["added"] and first["path"] == "datasets/cam/night1/f.npz"
    code, again = agent(root, "add-file", "datasets/cam/night1", "f.npz", stdin=b"shard")
    assert code == 0 and not again["added"] and again["sha256"] == first["sha256"]
    code, other = agent(root, "add-file", "datasets/cam/night1", "f.npz", stdin=b"other")
    assert code == ExitCode.DATA_MISMATCH and "only grows" in other["error"]
    folder = root / "datasets" / "cam" / "night1"
    assert [p.name for p in folder.iterdir()] == ["f.npz"] and (folder / "f.npz").read_bytes() == b"shard"
