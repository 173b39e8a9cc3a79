"""The host's exit codes and retry policy (tasks/exits.py, tasks/errors.py): one code per error class, each with help,
none shared with the agent; the tree, the table, the classes' codes, retry flags and docstrings all
rendered from ``HOST_EXITS``, and the manual's table (docs/reference/exit-codes.md) equal to it.

``.venv/bin/python -m tests.test_errors`` rewrites that page from ``HOST_EXITS`` (as ``python -m docs.gen``
does with every reference page).
"""

from __future__ import annotations

import re

import pytest

import tasks.stack  # noqa: F401 - registers StackError, the one PipelineError outside tasks/errors.py
from device_agent.protocol import EXIT_HELP, NEVER_RETRY, ExitCode
from tasks import errors
from tasks.errors import HostExit, PipelineError
from tasks.exits import HOST_EXIT_HELP, HOST_EXITS, exit_table
from tasks.paths import PROJECT_ROOT

EXIT_PAGE = PROJECT_ROOT / "docs" / "reference" / "exit-codes.md"
HEADER = exit_table().splitlines()[0]


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
    for status in (1, 2, 129, 130, 143):  # a traceback, an argparse usage error, SIGHUP, Ctrl-C, SIGTERM
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
    assert [i.code for i in HOST_EXITS] == list(HostExit)


def _page_table(lines: list[str]) -> slice:
    """Where the page's exit-code table is: its header line and the table lines after it."""
    start = lines.index(HEADER)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return slice(start, end)


def test_the_manuals_table_is_rendered_from_host_exits() -> None:
    lines = EXIT_PAGE.read_text().splitlines()
    assert lines[_page_table(lines)] == exit_table().splitlines(), (
        "run: .venv/bin/python -m tests.test_errors"
    )


def test_each_class_takes_code_retry_flag_parent_and_cause_from_host_exits() -> None:
    by_name = {cls.__name__: cls for cls in _error_classes()}
    for info in HOST_EXITS:
        cls = by_name[info.error]
        assert (cls.exit_code, cls.retryable) == (info.code, info.retryable)
        assert cls.__bases__[0].__name__ == (info.parent or "Exception")
        assert cls.__module__ == (info.home or "tasks.errors")
        if not info.home:  # classes elsewhere write their own docstring
            assert (cls.__doc__ or "").startswith(info.cause[0].upper() + info.cause[1:] + ".")
    assert all(info.cause in (errors.__doc__ or "") for info in HOST_EXITS)  # the tree


def write_exit_page() -> None:
    """Rewrite the manual's exit-code page (its table rendered from ``HOST_EXITS``) with the reference's generator."""
    from docs.gen import write

    write(EXIT_PAGE.parent, ["exit-codes.md"])


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


if __name__ == "__main__":
    write_exit_page()
