"""The board's pull-mode client against a real local HTTPS endpoint (:mod:`tests.agent.pull_kit`):
every request signed as the contract says, the certificate pinned before any request, blobs
resumed with ``Range`` and verified, 429 waited out, outputs resumed from the host's offset, a
refused credential ending the service with its own exit code."""

from __future__ import annotations

import hashlib
import os
import ssl
import stat
import time
from pathlib import Path

import pytest

from device_agent.cli import main
from device_agent.errors import AgentError
from device_agent.protocol import ExitCode, FileRef, blob_tmp_name
from device_agent.pull.client import RETRY_AFTER_CAP_S, retry_after_s
from device_agent.pull.config import load_config
from device_agent.pull.contract import CHUNK, H_NONCE, H_TIME, MAX_SKEW_S, NONCE_RE, cert_pin
from device_agent.pull.service import serve
from device_agent.pull.transfer import BLOB_ATTEMPTS, fetch_blob, upload_output
from tests.agent import pull_kit
from tests.agent.pull_kit import BOARD, Board, Endpoint, make_cert

key_root, endpoint, board = pull_kit.key_root, pull_kit.endpoint, pull_kit.board  # the kit's fixtures


def test_the_key_is_private_and_every_request_is_signed(board: Board, endpoint: Endpoint) -> None:
    key = board.root / "pull" / "board.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert b"PRIVATE KEY" in key.read_bytes() and "PRIVATE" not in board.client.identity.public_pem()
    assert board.client.call("POST", "poll", {"info": {}, "jobs": {}}).status == 200
    assert board.client.call("GET", "jobs/j1/files/" + "a" * 64).data == {"offset": 0}
    assert board.client.call("POST", "jobs/j1/events", b"{}\n", query={"offset": 0}).data == {"offset": 3}
    assert endpoint.connections == 2, (
        "the certificate's fetch, then one kept-alive connection for every request"
    )
    assert [s.verified for s in endpoint.seen] == [True] * 3
    assert endpoint.seen[2].path == "/odl/v1/jobs/j1/events?offset=0"  # the query is signed as sent
    nonces = [s.headers[H_NONCE] for s in endpoint.seen]
    assert len(set(nonces)) == 3 and all(NONCE_RE.match(n) for n in nonces)
    assert all(abs(int(s.headers[H_TIME]) - time.time()) < MAX_SKEW_S for s in endpoint.seen)
    pem = (board.root / "pull" / "endpoint.pem").read_text()
    assert cert_pin(ssl.PEM_cert_to_DER_cert(pem)) == endpoint.pin  # what later connections verify against


def test_a_pin_that_differs_is_refused_in_one_line_before_any_request(
    tmp_path: Path, key_root: Path, endpoint: Endpoint
) -> None:
    wrong = "sha256:" + "0" * 64
    board = Board(tmp_path / "board", key_root, endpoint, pin=wrong)
    with pytest.raises(AgentError) as err:
        board.client.call("POST", "poll", {"info": {}, "jobs": {}})
    assert err.value.code == ExitCode.UNTRUSTED and "\n" not in str(err.value)
    assert endpoint.pin in str(err.value) and wrong in str(err.value) and "nothing sent" in str(err.value)
    assert endpoint.seen == [] and not (board.root / "pull" / "endpoint.pem").exists()


def test_another_certificate_later_is_refused_on_the_next_connection(
    board: Board, endpoint: Endpoint
) -> None:
    assert board.client.call("POST", "poll", {"info": {}, "jobs": {}}).status == 200
    board.client.close()
    cert, key, _ = make_cert(endpoint.folder, "other")
    endpoint.use_cert(cert, key)
    with pytest.raises(AgentError) as err:
        board.client.call("POST", "poll", {"info": {}, "jobs": {}})
    assert err.value.code == ExitCode.UNTRUSTED and "not the pinned one" in str(err.value)
    assert len(endpoint.seen) == 1 and board.slept == [], "refused at once, never retried"


def _blob(endpoint: Endpoint, size: int) -> tuple[str, bytes]:
    data = os.urandom(size)
    sha = hashlib.sha256(data).hexdigest()
    endpoint.blobs[sha] = data
    return sha, data


def test_a_cut_download_resumes_with_range_and_ends_verified(board: Board, endpoint: Endpoint) -> None:
    sha, data = _blob(endpoint, 2 * CHUNK + 4321)
    endpoint.cut_blob_at[sha] = CHUNK + 17
    fetch_blob(board.client, board.root, sha, len(data))
    gets = [s for s in endpoint.seen if s.route == f"blobs/{sha}"]
    assert [s.headers.get("Range") for s in gets] == [None, f"bytes={CHUNK + 17}-"]
    blob = board.root / "blobs" / sha
    assert blob.read_bytes() == data and stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert [p.name for p in (board.root / "blobs").iterdir()] == [sha], "no partial file left"


def test_a_partial_download_of_an_earlier_run_is_resumed(board: Board, endpoint: Endpoint) -> None:
    sha, data = _blob(endpoint, 300_000)
    (board.root / "blobs").mkdir()
    (board.root / "blobs" / blob_tmp_name(sha, "ab" * 8)).write_bytes(data[:123_456])
    fetch_blob(board.client, board.root, sha, len(data))
    assert [s.headers.get("Range") for s in endpoint.seen] == ["bytes=123456-"]
    assert (board.root / "blobs" / sha).read_bytes() == data


def test_a_corrupted_blob_is_refused_and_dropped(board: Board, endpoint: Endpoint) -> None:
    sha, data = _blob(endpoint, 5000)
    endpoint.blobs[sha] = b"x" + data[1:]
    with pytest.raises(AgentError) as err:
        fetch_blob(board.client, board.root, sha, len(data))
    assert err.value.code == ExitCode.BLOB_MISMATCH and "\n" not in str(err.value)
    assert f"blob {sha}" in str(err.value) and "dropped" in str(err.value)
    assert len(endpoint.seen) == BLOB_ATTEMPTS and all("Range" not in s.headers for s in endpoint.seen)
    assert list((board.root / "blobs").iterdir()) == [], "neither the blob nor a partial file is kept"


def test_429_waits_its_retry_after_plus_jitter(board: Board, endpoint: Endpoint) -> None:
    endpoint.busy["poll"] = 2
    answer = board.client.call("POST", "poll", {"info": {}, "jobs": {}})
    assert answer.status == 200 and len(endpoint.seen) == 3
    assert len(board.slept) == 2 and all(7.0 <= s <= 7.0 * 1.1 + 0.5 for s in board.slept), board.slept
    assert retry_after_s("999999") <= RETRY_AFTER_CAP_S * 1.1 + 0.5 and 1.0 <= retry_after_s(None) <= 1.6


def test_a_cut_upload_resumes_from_the_hosts_offset(board: Board, endpoint: Endpoint, tmp_path: Path) -> None:
    folder = board.root / "jobs" / "j1"
    folder.mkdir(parents=True)
    data = os.urandom(2 * CHUNK + 999)
    (folder / "inference.onnx").write_bytes(data)
    ref = FileRef("inference.onnx", hashlib.sha256(data).hexdigest(), len(data))
    endpoint.files[ref.sha256] = bytearray(data[:1000])  # an earlier run sent 1000 bytes
    endpoint.cut_put = True  # and this one is cut half way through its first piece
    upload_output(board.client, "j1", folder, "inference", ref)
    assert bytes(endpoint.files[ref.sha256]) == data
    puts = [int(s.query["offset"]) for s in endpoint.seen if s.method == "PUT"]
    half = 1000 + min(CHUNK, len(data) - 1000) // 2
    assert puts == [1000, 1000, half, half + CHUNK], puts  # cut; sent again: 409 and the host's offset
    assert endpoint.seen[0].method == "GET" and {int(s.query["size"]) for s in endpoint.seen[1:]} == {
        len(data)
    }


def test_a_refused_credential_stops_the_service_with_its_exit_code(
    board: Board, endpoint: Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint.refuse_poll = True
    assert serve(board.root, client=board.client, sleep=board.slept.append) == ExitCode.UNTRUSTED == 37
    line = f"the endpoint refused board {BOARD}: board {BOARD} is revoked (HTTP 403): the service stops (exit 37)"
    assert line in (board.root / "pull" / "service.log").read_text()
    assert main(["--root", str(board.root), "pull", "--endpoint", endpoint.url]) == ExitCode.UNTRUSTED
    assert (
        main(["--root", str(board.root), "pull", "--endpoint", "https://elsewhere:1"])
        == ExitCode.INVALID_ARGUMENT
    )
    assert load_config(board.root) == board.config
