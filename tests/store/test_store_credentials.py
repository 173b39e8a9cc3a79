"""The shared store's credentials: a host without them, or with wrong ones, is refused in one line
naming the variable and what is expected; no secret reaches a log line, a message, a version or a
file of the host's ODL_HOME; ``odl registry`` obeys the same."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from tasks.errors import StoreError, StoreUnreachable, should_retry
from tasks.judge.registry_open import open_registry
from tasks.judge.registry_shared import SharedRegistry
from tasks.paths import PROJECT_ROOT
from tests.fixtures_postgres import free_ports
from tests.fixtures_store import store_password
from tests.store.kit import model_file, verdict

pytestmark = pytest.mark.slow


def _refused(monkeypatch, tmp_path, **env: str | None) -> StoreError:
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    with pytest.raises(StoreError) as caught:
        open_registry(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    return caught.value


def _pwfile(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "pw"
    path.write_text(text + "\n")
    path.chmod(mode)
    return str(path)


def test_wrong_or_missing_credentials_are_refused_in_one_line(store_env, tmp_path, monkeypatch):
    secret, url = store_password(store_env), store_env["ODL_STORE_URL"]
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))  # libpq finds no password file either
    wrong = _refused(
        monkeypatch, tmp_path, ODL_STORE_URL=url, ODL_STORE_PASSWORD_FILE=_pwfile(tmp_path, "nope")
    )
    assert str(wrong).startswith(f"ODL_STORE_URL={url}: the server refused user odl (password authentication")
    assert "expected the user's password in the file named by ODL_STORE_PASSWORD_FILE" in str(wrong)
    assert wrong.exit_code == 71 and not should_retry(wrong) and "nope" not in str(wrong)
    none = _refused(monkeypatch, tmp_path, ODL_STORE_PASSWORD_FILE=None)
    assert "no password supplied" in str(none) and "~/.pgpass" in str(none)
    in_url = _refused(monkeypatch, tmp_path, ODL_STORE_URL=url.replace("odl@", f"odl:{secret}@"))
    assert str(in_url).startswith("ODL_STORE_URL: holds a password; expected postgresql://USER@HOST:PORT/DB")
    assert secret not in str(in_url)
    monkeypatch.setenv("ODL_STORE_URL", url)
    loose = _refused(monkeypatch, tmp_path, ODL_STORE_PASSWORD_FILE=_pwfile(tmp_path, secret, 0o644))
    assert str(loose).endswith("lets others read it; expected mode 0600 (chmod 600)")
    gone = _refused(monkeypatch, tmp_path, ODL_STORE_PASSWORD_FILE=str(tmp_path / "absent"))
    assert str(gone).startswith(f"ODL_STORE_PASSWORD_FILE={tmp_path / 'absent'}: cannot read it")
    bad = _refused(monkeypatch, tmp_path, ODL_STORE_URL="mysql://odl@h/db")
    assert (
        str(bad)
        == "ODL_STORE_URL: expected postgresql://USER@HOST:PORT/DB (no password in it) (got 'mysql://h/db')"
    )
    assert secret not in " ".join(map(str, (wrong, none, in_url, loose, gone, bad)))


def test_a_libpq_password_file_is_enough(store_env, tmp_path, monkeypatch):
    port, db = store_env["ODL_STORE_URL"].rsplit(":", 1)[1].split("/")
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{port}:{db}:odl:{store_password(store_env)}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    monkeypatch.setenv("ODL_STORE_URL", store_env["ODL_STORE_URL"])
    monkeypatch.delenv("ODL_STORE_PASSWORD_FILE", raising=False)
    assert isinstance(open_registry(tmp_path), SharedRegistry)


def test_no_server_is_retryable_in_one_line(tmp_path, monkeypatch):
    (port,) = free_ports(1)
    down = _refused(monkeypatch, tmp_path, ODL_STORE_URL=f"postgresql://odl@127.0.0.1:{port}/x",
                    ODL_STORE_PASSWORD_FILE=_pwfile(tmp_path, "pw"))  # fmt: skip
    assert isinstance(down, StoreUnreachable) and should_retry(down) and down.exit_code == 72
    assert str(down).startswith(
        f"ODL_STORE_URL=postgresql://odl@127.0.0.1:{port}/x: the store cannot be reached"
    )


def test_no_secret_in_logs_messages_versions_or_files(shared_store, tmp_path, monkeypatch, caplog):
    secret = store_password(shared_store)
    caplog.set_level(logging.DEBUG)  # every logger, psycopg's included
    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    reg = open_registry()
    for i in range(2):
        reg.record("digits", "lab", model_file(tmp_path, f"m{i}".encode()), {"accuracy": i}, verdict(True, i))
    reg.rollback("digits", "lab")
    other = open_registry(tmp_path / "other")  # a second host fetches the files
    seen = [repr(reg), repr(reg.store), repr(reg.store.cfg), repr(other.current("digits", "lab"))]
    seen += [repr(v) + v.model.read_text() for v in other.versions("digits", "lab")]
    assert "registry digits-lab (shared): recorded v0002 (promoted)" in caplog.text
    assert secret not in caplog.text and secret not in " ".join(seen)
    for home in (tmp_path / "home", tmp_path / "other"):
        for path in home.rglob("*"):
            assert not path.is_file() or secret.encode() not in path.read_bytes(), path
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    cli = [sys.executable, "-m", "flows.cli", "registry", "digits", "lab"]
    shown = subprocess.run(cli, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "* v0001" in shown.stdout and "  v0002" in shown.stdout, shown.stderr
    assert secret not in shown.stdout + shown.stderr
    (tmp_path / "wrong").write_text("wrong\n")
    (tmp_path / "wrong").chmod(0o600)
    refused = subprocess.run(cli, env={**env, "ODL_STORE_PASSWORD_FILE": str(tmp_path / "wrong")},
                             cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 71 and refused.stdout == "", refused.stderr
    assert refused.stderr.startswith("odl: error: ODL_STORE_URL=postgresql://odl@127.0.0.1:")
    assert len(refused.stderr.strip().splitlines()) == 1 and secret not in refused.stderr
