"""The virtual board's shaped link (``--link "rate=10mbit,delay=50ms,loss=1%"``): parsing and its
errors, then on a real board (root only) the measured rate, the round trip, the loss rule's drops,
whole transfers in spite of them, and the delay proxy's life with the board."""

from __future__ import annotations

import os
import posixpath
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.board.inventory import Board
from tasks.board.transport import connect
from tasks.errors import BoardError
from tasks.vboard.link import LinkSpec, parse_link
from tests.fixtures_board import BOARD_VENV, odl_home_env

SPEC = "rate=10mbit,delay=50ms,loss=1%"
PAYLOAD = 2 * 2**20  # ~1.7 s each way at 10 Mbit/s


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (SPEC, LinkSpec(10_000_000, 50.0, 1.0)),
        ("delay=0.2s", LinkSpec(delay_ms=200.0)),
        ("loss=0.5%, rate=512kbit", LinkSpec(rate_bps=512_000, loss_pct=0.5)),
        ("RATE=1.5Mbit", LinkSpec(rate_bps=1_500_000)),
    ],
)
def test_parse_link(text: str, want: LinkSpec) -> None:
    assert parse_link(text) == want
    assert parse_link(str(want)) == want  # str() is the canonical spec, recorded in state.json


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "cannot read ''"),
        ("rate=10", "rate=10 has no unit or a wrong one"),
        ("rate=10mbps", "has no unit or a wrong one"),
        ("delay=50", "delay=50 has no unit"),
        ("loss=1", "loss=1 has no unit"),
        ("jitter=5ms", "cannot read 'jitter=5ms'"),
        ("rate=10mbit,rate=5mbit", "rate is given twice"),
        ("loss=80%", "loss must be above 0% and at most 50%"),
        ("delay=0ms", "delay must be above 0"),
        ("rate=1bit", "rate must be between 8kbit and 10gbit"),
        ("rate 10mbit", "cannot read 'rate 10mbit'"),
    ],
)
def test_bad_link_specs_name_the_flag_and_the_form(text: str, why: str) -> None:
    with pytest.raises(BoardError) as info:
        parse_link(text)
    msg = str(info.value)
    assert msg.startswith(f"--link {text!r}: ") and why in msg
    assert "expected KEY=VALUE[,KEY=VALUE...] with rate=10mbit" in msg


def test_link_needs_the_network_namespace_board(tmp_path: Path) -> None:
    from tasks.vboard.lifecycle import board_up

    with odl_home_env(tmp_path), pytest.raises(BoardError, match="--link needs the board's own network"):
        board_up("hxnever", netns=False, link="delay=10ms")
    assert not (tmp_path / "inventory.toml").exists()


@pytest.fixture(scope="module")
def shaped(virtual_board_home: Path) -> Iterator[Board]:
    """A board behind the issue's link: 10 Mbit/s each way, 50 ms each way, 1% of packets lost."""
    from tasks.vboard.lifecycle import board_down, board_up

    if os.geteuid() != 0:
        pytest.skip("the virtual board needs root (useradd, ip netns, sshd, tc, nft)")
    name = f"lnk{os.getpid()}"
    with odl_home_env(virtual_board_home):
        board = board_up(name, link=SPEC, venv=BOARD_VENV)
    try:
        yield board
    finally:
        with odl_home_env(virtual_board_home):
            board_down(name, purge=True)


def _state(board: Board, home: Path) -> dict:
    from tasks.vboard.lifecycle import board_status

    with odl_home_env(home):
        return board_status(board.name)


@pytest.mark.board
def test_inventory_names_the_proxy_and_its_host_key_is_pinned(
    shaped: Board, virtual_board_home: Path
) -> None:
    state = _state(shaped, virtual_board_home)
    assert state["link"] == SPEC and state["proxy_running"]
    assert (
        (shaped.host, shaped.port) == (state["proxy"]["host"], state["proxy"]["port"]) != (state["host"], 22)
    )
    pinned = Path(shaped.known_hosts).read_text()
    assert f"[{shaped.host}]:{shaped.port} ssh-ed25519 " in pinned


@pytest.mark.board
def test_rate_round_trip_and_loss_are_what_the_spec_says(
    shaped: Board, virtual_board_home: Path, tmp_path: Path
) -> None:
    from tasks.vboard import link

    state = _state(shaped, virtual_board_home)
    before = link.loss_counters(state)
    src = tmp_path / "payload.bin"
    src.write_bytes(secrets.token_bytes(PAYLOAD))
    remote = posixpath.join(posixpath.dirname(shaped.root), f"link-{secrets.token_hex(3)}.bin")
    conn = connect(shaped)
    try:
        rtts = []
        for _ in range(3):
            start = time.perf_counter()
            conn.run(["true"])  # a channel: open, exec, exit status, close
            rtts.append(time.perf_counter() - start)
        start = time.perf_counter()
        conn.put(src, remote)
        up = PAYLOAD * 8 / (time.perf_counter() - start) / 1e6
        start = time.perf_counter()
        conn.get(remote, tmp_path / "back.bin")
        down = PAYLOAD * 8 / (time.perf_counter() - start) / 1e6
        conn.run(["rm", "-f", remote])
    finally:
        conn.close()
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()  # whole, in spite of the losses
    assert min(rtts) >= 2 * 0.050, rtts  # at least one round trip through the 50 ms each way
    assert 4.0 < up < 10.5 and 4.0 < down < 10.5, (up, down)  # Mbit/s of payload over 10 Mbit/s
    after = link.loss_counters(state)
    assert after["to_board"] > before["to_board"] and after["from_board"] > before["from_board"], after
    qdiscs = link.qdisc_stats(state)
    assert qdiscs.count("tbf") == 2 and qdiscs.count("rate 10Mbit") == 2


@pytest.mark.board
def test_down_stops_the_proxy_and_up_starts_a_new_one(shaped: Board, virtual_board_home: Path) -> None:
    from tasks.vboard import link
    from tasks.vboard.lifecycle import board_down, board_up
    from tasks.vboard.sshd import port_open

    old = _state(shaped, virtual_board_home)
    with odl_home_env(virtual_board_home):
        board_down(shaped.name)
        assert not link.proxy_alive(old) and not port_open(shaped.host, shaped.port)
        again = board_up(shaped.name, link=SPEC, venv=BOARD_VENV)
        assert board_up(shaped.name, link=SPEC, venv=BOARD_VENV) == again  # idempotent: same proxy
    new = _state(again, virtual_board_home)
    assert new["proxy_running"] and new["proxy"]["pid"] != old["proxy"]["pid"]
    conn = connect(again)
    try:
        assert conn.run(["id", "-un"]).stdout.strip() == again.user
    finally:
        conn.close()
