"""Two checkouts on one machine, each with its own ODL_HOME: their virtual boards of the same name
and their Prefect stacks never take over each other's (issue 28: a second checkout's demo replaced
the first one's board key and wrote its runs into the first one's server)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.fixtures_board import BOARD_VENV, odl_home_env

pytestmark = [pytest.mark.slow, pytest.mark.board]


@contextlib.contextmanager
def _own_environ():
    """Run without PREFECT_API_URL and restore the whole environment after (prefect_api sets some)."""
    saved = dict(os.environ)
    os.environ.pop("PREFECT_API_URL", None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_machine_names_carry_the_home(tmp_path: Path):
    from tasks.vboard.owner import machine_name, unix_user

    a, b = tmp_path / "a" / ".odl", tmp_path / "b" / ".odl"
    assert machine_name("vboard", a) != machine_name("vboard", b)
    assert machine_name("vboard", a) == machine_name("vboard", a)
    assert len(unix_user("x" * 20, a)) <= 32  # the longest board name still makes a Unix user name


def test_same_board_name_in_two_homes_are_two_boards(tmp_path: Path):
    from tasks.board.transport import connect
    from tasks.vboard.lifecycle import board_down, board_up

    if os.geteuid() != 0:
        pytest.skip("the virtual board needs root (useradd, ip netns, sshd)")
    name = f"h{os.getpid()}"
    homes = [tmp_path / "one" / ".odl", tmp_path / "two" / ".odl"]
    boards = []
    try:
        for home in homes:
            with odl_home_env(home):
                boards.append(board_up(name, venv=BOARD_VENV))
        users = set()
        for home, board in zip(homes, boards, strict=True):  # the first still answers with its own key
            with odl_home_env(home):
                conn = connect(board)
                try:
                    users.add(conn.run(["whoami"]).stdout.strip())
                finally:
                    conn.close()
        assert len(users) == 2 and all(u.startswith(f"odl-{name}-") for u in users)
        assert boards[0].host != boards[1].host
    finally:
        for home in homes:
            with odl_home_env(home):
                board_down(name, purge=True)


def test_a_stack_never_uses_another_homes_server(tmp_path: Path, capsys):
    """Home one's stack runs; home two sees it on the port, refuses it with one line, and gets its
    own server on another port; each home's CLI and flows point at their own server only. Home one
    is started with ``ODL_ALERT_WEBHOOK`` set (a webhook no one listens at): its "board silent"
    automation is installed at up, sending to that webhook's block (that it fires and reaches a
    webhook: tests/e2e/test_alerts.py, on the session's stack)."""
    from flows.cli.home import prefect_api
    from tasks.stack import StackError, ownership, server

    one, two = tmp_path / "one" / ".odl", tmp_path / "two" / ".odl"
    port = ownership.free_port(0)
    env1 = server.stack_env(port=port, home=one)
    try:
        server.up({**env1, "ODL_ALERT_WEBHOOK": "http://127.0.0.1:9/unheard"})
        silent = [a for a in _post(env1, "/automations/filter", {}) if a["name"] == "odl: board silent"]
        assert len(silent) == 1 and silent[0]["actions"][0]["type"] == "send-notification", silent
        assert ownership.is_ours(env1)
        assert ownership.server_owner(env1)["home"] == str(one)
        with odl_home_env(two):
            foreign = server.stack_env(port=port, home=two)
            assert not ownership.is_ours(foreign)
            assert ownership.foreign_server(foreign) == (
                f"the Prefect server at http://127.0.0.1:{port} belongs to the project home {one}, "
                f"not to {two}: not used"
            )
            with pytest.raises(StackError, match=f"belongs to the project home {one}"):
                server.up(foreign)  # an explicit port held by another home: refused, not shared
            assert ownership.choose_port(two) != port  # without --port: a free one
            with _own_environ():
                where = prefect_api()
                assert "temporary Prefect server" in where and "PREFECT_API_URL" not in os.environ
                assert f"belongs to the project home {one}" in capsys.readouterr().out
        with odl_home_env(one), _own_environ():
            assert prefect_api() == f"the local stack's server (http://127.0.0.1:{port})"
    finally:
        server.down(one)
        server.down(two)


def _post(env, path, body):
    from tests.e2e.prefect_api import post

    return post(env, path, body)
