"""The host's exit codes and retry policy (tasks/errors.py): one code per error class, each with help,
none shared with the agent, the table in the module's docstring in step with the enum."""

from __future__ import annotations

import re

import pytest

import flows.stack  # noqa: F401 - registers StackError, the one PipelineError outside tasks/
from device_agent.protocol import EXIT_HELP, NEVER_RETRY, ExitCode
from tasks import errors
from tasks.errors import HOST_EXIT_HELP, HostExit, PipelineError
from tasks.paths import PROJECT_ROOT


def _error_classes() -> list[type[PipelineError]]:
    out, todo = [], [PipelineError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def test_every_host_code_has_help() -> None:
    assert set(HOST_EXIT_HELP) == set(HostExit)
    assert all(len(text) > 20 and ": " in text for text in HOST_EXIT_HELP.values())  # cause: what to do


def test_codes_collide_neither_with_each_other_nor_with_the_agent() -> None:
    host = [int(c) for c in HostExit]
    agent = [int(c) for c in ExitCode]
    assert len(set(host)) == len(host) and len(set(agent)) == len(agent)
    assert all(50 <= c <= 79 for c in host) and all(c < 50 for c in agent)
    assert set(EXIT_HELP) == set(ExitCode)
    for status in (1, 2, 130):  # a traceback, an argparse usage error, Ctrl-C
        assert status not in host and status not in agent


def test_each_error_class_has_its_own_code() -> None:
    classes = _error_classes()
    codes = {cls: cls.exit_code for cls in classes}
    assert all(isinstance(code, HostExit) for code in codes.values()), codes
    assert len(set(codes.values())) == len(classes) == len(HostExit), codes


def test_docstring_table_matches_the_enum() -> None:
    doc = errors.__doc__ or ""
    name_of = {cls.exit_code: cls.__name__ for cls in _error_classes()}
    rows = [line for line in doc.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert rows == [f"| {int(c)} | `{c.name}` | `{name_of[c]}` | {HOST_EXIT_HELP[c]} |" for c in HostExit]
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert [line for line in readme.splitlines() if re.match(r"^\| \d+ \|", line)] == rows


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (errors.DeviceUnreachable("link down"), True),
        (errors.TransferError("hash mismatch"), True),
        (errors.HostKeyRejected("changed"), False),
        (errors.DeviceIncompatible("protocol"), False),
        (errors.RemoteCommandFailed(["false"], 1), False),
        (errors.TrainingFailed("diverged"), False),
        (errors.RecipeError("name", "a name"), False),
        (OSError("not ours"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_should_retry_only_retryable_classes(exc: BaseException, retry: bool) -> None:
    assert errors.should_retry(exc) is retry


def test_agent_exit_retryable_is_never_retry_complement() -> None:
    for code in ExitCode:
        assert errors.agent_exit_retryable(code) is (code not in NEVER_RETRY)
    assert not errors.agent_exit_retryable(ExitCode.DIVERGED) and errors.agent_exit_retryable(
        ExitCode.NO_MEMORY
    )
