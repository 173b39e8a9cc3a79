"""A store lost in the middle of a write (issue 45): the write's transaction is rolled back whole, the
writer gets one retryable line, and a session the server no longer hears from gives its locks back
within ODL_STORE_TIMEOUT_S. tests/e2e/test_hosts_faults.py cuts a simulated host's link for real."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tasks.errors import StoreError, StoreUnreachable, should_retry
from tasks.store import Documents, PgBlobStore, Store, store_config
from tests.store.kit import waiting_pid

pytestmark = pytest.mark.slow


def test_a_blob_whose_writer_is_lost_mid_put_is_absent_whole(store_env, tmp_path):
    cfg = store_config(store_env)
    writer, admin = Store(cfg), psycopg.connect(**cfg.connect_kwargs(), autocommit=True)
    writer.check()  # the tables exist
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (3 * 4096 + 7))  # four chunks
    caught: list[BaseException] = []
    with admin.transaction():  # the chunks' table locked: the put waits inside its transaction
        admin.execute("LOCK TABLE odl_blob_chunks IN SHARE MODE")
        put = threading.Thread(target=lambda: _catch(caught, PgBlobStore(writer).put, big))
        put.start()
        pid = waiting_pid(cfg, "INSERT INTO odl_blob_chunks")
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))  # the writer's link is gone, mid-put
    put.join(timeout=30)
    (exc,) = caught
    assert isinstance(exc, StoreUnreachable) and should_retry(exc) and exc.exit_code == 72
    assert str(exc).startswith(f"ODL_STORE_URL={cfg.url}: lost the store (") and "\n" not in str(exc)
    assert admin.execute("SELECT (SELECT count(*) FROM odl_blobs), (SELECT count(*) FROM odl_blob_chunks)"
                         ).fetchone() == (0, 0)  # fmt: skip
    sha = PgBlobStore(writer).put(big)  # the next try reconnects and stores it whole
    assert PgBlobStore(writer).present({sha}) == {sha}
    assert PgBlobStore(writer).fetch(sha, tmp_path / "back").read_bytes() == big.read_bytes()
    writer.close()
    admin.close()


def test_a_transaction_the_server_stops_hearing_from_is_rolled_back_and_its_lock_freed(store_env):
    """A writer silent inside its transaction for longer than ODL_STORE_TIMEOUT_S (as a host cut off
    mid-write is, seen from the server) is rolled back: its document never lands, another host's
    update of the same document goes through, and the writer's next statement fails in one line."""
    cfg = store_config({**store_env, "ODL_STORE_TIMEOUT_S": "2"})
    settings = {k: v for k, v in cfg.connect_kwargs().items() if k in ("tcp_user_timeout", "keepalives_idle")}
    assert settings == {"tcp_user_timeout": 2000, "keepalives_idle": 1}
    silent, other = Store(cfg), Store(store_config(store_env))
    with pytest.raises(StoreUnreachable) as caught, Documents(silent).update("inventory.toml") as doc:
        doc.content = b"half"
        time.sleep(3.5)  # past the server's idle_in_transaction_session_timeout of 2 s: rolled back
    assert "\n" not in str(caught.value) and "run again" in str(caught.value)
    t0 = time.monotonic()
    with Documents(other).update("inventory.toml") as doc:  # the advisory lock was given back
        assert doc.content is None
        doc.content = b"whole"
    assert time.monotonic() - t0 < 5
    assert Documents(other).get("inventory.toml").content == b"whole"
    silent.close()
    other.close()


@pytest.mark.parametrize("value", ["0", "1", "soon", "4000"])
def test_a_timeout_out_of_range_is_refused_in_one_line(store_env, value):
    with pytest.raises(StoreError) as caught:
        store_config({**store_env, "ODL_STORE_TIMEOUT_S": value})
    assert str(caught.value) == f"ODL_STORE_TIMEOUT_S={value}: expected seconds in [2, 3600] (default 30)"


def _catch(caught: list[BaseException], fn, *args) -> None:  # noqa: ANN001
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        caught.append(exc)
