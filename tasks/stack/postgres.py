"""A private PostgreSQL cluster for the Prefect server of the stack (``odl stack up --db postgres``).

Debian's server binaries (``/usr/lib/postgresql/<newest version>/bin``; ``apt-get install postgresql``)
run one cluster per ODL_HOME, on 127.0.0.1 only (the stack's; a store other hosts reach may listen
beyond it: :func:`start`, :func:`allow_network`), with its unix socket in its own folder. The cluster
folder holds ``data/`` (PGDATA), ``socket/`` and ``password`` (the ``prefect`` role's, generated once,
mode 0600). Superuser access is by peer authentication over the socket; TCP needs a password.

Where the cluster folder lives: PostgreSQL refuses to run as root. As a normal user it runs as that
user in ``$ODL_HOME/postgres``. As root it runs as the Debian ``postgres`` system user (setpriv), so
its data must be owned by that user and every parent folder traversable by it: ``$ODL_HOME/postgres``
when ``postgres`` can reach $ODL_HOME, else ``/var/lib/odl-postgres/<hash of ODL_HOME>`` with a symlink
``$ODL_HOME/postgres`` to it (pytest's tmp folders, /root and other 0700 parents). The choice is made
once, when the cluster is created; :func:`remove` deletes the cluster (data included).

The postmaster's pid is recorded in ``$ODL_HOME/run/postgres.pid`` like the other services of the
stack, its log is ``$ODL_HOME/logs/postgres.log``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from tasks.stack import StackError
from tasks.stack.processes import pidfile, running_pid, stop_service

DEFAULT_PORT = 5433
SYSTEM_USER = "postgres"
ROOT_CLUSTERS = Path("/var/lib/odl-postgres")
INSTALL_HINT = "apt-get install postgresql (or `make install`: deploy/system-packages.txt lists it)"


def bindir() -> Path:
    """The newest installed PostgreSQL server's bin folder (Debian layout, else ``pg_ctl`` on PATH)."""
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "pg_ctl").is_file()]
    found.sort(key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)])
    if found:
        return found[-1]
    if which := shutil.which("pg_ctl"):
        return Path(which).resolve().parent
    raise StackError(f"PostgreSQL server not installed (no /usr/lib/postgresql/*/bin/pg_ctl): {INSTALL_HINT}")


def _system_user() -> pwd.struct_passwd | None:
    """The account the server runs as: None for the current (non-root) user, else ``postgres``."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise StackError(
            f"PostgreSQL refuses to run as root and there is no '{SYSTEM_USER}' system user: "
            f"{INSTALL_HINT} creates it, or run odl as a normal user"
        ) from None


def _run(cluster: Path, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run a PostgreSQL program as the cluster's owner, with no PG* variables of the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    user = _system_user()
    if user is not None:
        env.update(HOME=str(cluster), USER=user.pw_name, LOGNAME=user.pw_name)
        argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--", *argv]
    kw.setdefault("capture_output", "stdout" not in kw)
    kw.setdefault("timeout", 180)
    return subprocess.run(argv, env=env, cwd=cluster, text=True, **kw)


def _reachable(home: Path, user: pwd.struct_passwd) -> bool:
    ok = subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--",
         "test", "-x", str(home)], capture_output=True, cwd="/",
    )  # fmt: skip
    return ok.returncode == 0


def cluster_dir(home: Path, create: bool = False) -> Path | None:
    """The cluster folder of ``home`` (resolved), None if there is none and ``create`` is false."""
    link = Path(home) / "postgres"
    if link.is_dir():
        return link.resolve()
    if not create:
        return None
    home.mkdir(parents=True, exist_ok=True)
    user = _system_user()
    link.unlink(missing_ok=True)  # a dangling link: its cluster was removed
    if user is None or _reachable(home, user):
        link.mkdir(mode=0o700)
    else:
        ROOT_CLUSTERS.mkdir(mode=0o755, parents=True, exist_ok=True)
        ROOT_CLUSTERS.chmod(0o755)  # whatever the caller's umask (077 on CI): postgres must pass through
        real = ROOT_CLUSTERS / hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]
        real.mkdir(mode=0o700, exist_ok=True)
        link.symlink_to(real)
    if user is not None:
        os.chown(link.resolve(), user.pw_uid, user.pw_gid)
    return link.resolve()


def _socket_dir(cluster: Path) -> Path:
    """``socket/`` in the cluster folder; a short folder under /tmp if that path is too long for a socket."""
    sock = cluster / "socket"
    if len(str(sock)) + len("/.s.PGSQL.65535") > 100:
        sock = (
            Path(tempfile.gettempdir()) / f"odl-pg-{hashlib.sha256(str(cluster).encode()).hexdigest()[:12]}"
        )
    return sock


def password(home: Path) -> str | None:
    """The ``prefect`` role's password, None before the cluster was created."""
    cluster = cluster_dir(home)
    pwfile = cluster / "password" if cluster else None
    return pwfile.read_text().strip() if pwfile and pwfile.is_file() else None


def connection_url(home: Path, port: int) -> str | None:
    """The SQLAlchemy URL of database ``prefect`` for the Prefect server, None before :func:`init`."""
    pw = password(home)
    return f"postgresql+asyncpg://prefect:{pw}@127.0.0.1:{port}/prefect" if pw else None


def init(home: Path) -> Path:
    """Create the cluster folder, the password and the cluster (``initdb``) unless they exist."""
    binaries = bindir()
    cluster = cluster_dir(home, create=True)
    pwfile = cluster / "password"
    if not pwfile.is_file():
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(24) + "\n")
    sock = _socket_dir(cluster)
    sock.mkdir(mode=0o700, exist_ok=True)
    if (user := _system_user()) is not None:
        os.chown(sock, user.pw_uid, user.pw_gid)
    if not (cluster / "data" / "PG_VERSION").is_file():
        argv = [str(binaries / "initdb"), "-D", str(cluster / "data"), "--encoding=UTF8", "--no-locale",
                "--auth-local=peer", "--auth-host=scram-sha-256", "--no-instructions"]  # fmt: skip
        done = _run(cluster, argv)
        if done.returncode != 0:
            raise StackError(f"initdb of {cluster / 'data'} failed: {(done.stdout + done.stderr)[-1500:]}")
    return cluster


def _postmaster(cluster: Path | None) -> tuple[int, int] | None:
    """(pid, port) of the cluster's running postmaster, from its ``postmaster.pid``."""
    try:
        lines = (cluster / "data" / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        alive = state not in ("Z", "X") and b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (TypeError, OSError, ValueError, IndexError):
        return None
    return (pid, port) if alive else None  # else a stale file: the server crashed


def start(home: Path, port: int = DEFAULT_PORT, timeout: int = 60, listen: str = "127.0.0.1") -> int:
    """Create the cluster if needed, start it on ``listen``:``port`` (127.0.0.1: the stack's; another
    address, or ``0.0.0.0``, for a store other hosts reach: :func:`allow_network`), create role and
    database ``prefect``."""
    home = Path(home)
    cluster = init(home)
    running = _postmaster(cluster)
    if running and running[1] != port:
        raise StackError(f"PostgreSQL of {home} already runs on port {running[1]}: `odl stack down` first")
    if running is None:
        sock = _socket_dir(cluster)
        opts = f"-p {port} -c listen_addresses={listen} -c unix_socket_directories={shlex.quote(str(sock))}"
        log = home / "logs" / "postgres.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(bindir() / "pg_ctl"), "-D", str(cluster / "data"), "-w", "-t", str(timeout), "-o", opts]
        with open(log, "ab") as out:  # the postmaster keeps writing to this file
            done = _run(cluster, [*argv, "start"], stdout=out, stderr=subprocess.STDOUT)
        running = _postmaster(cluster)
        if done.returncode != 0 or running is None:
            tail = log.read_text(errors="replace")[-1500:]
            raise StackError(f"PostgreSQL did not start on {listen}:{port} (port in use?); {log}:\n{tail}")
    pidfile(home, "postgres").write_text(f"{running[0]}\n")
    _create_database(cluster, port)
    return running[0]


def _create_database(cluster: Path, port: int, role: str = "prefect", database: str = "prefect",
                     pwfile: str = "password") -> None:  # fmt: skip
    pw = (cluster / pwfile).read_text().strip()
    sql = (
        f"SELECT 'CREATE ROLE {role} LOGIN' WHERE NOT EXISTS "
        f"(SELECT FROM pg_roles WHERE rolname = '{role}')\\gexec\n"
        f"ALTER ROLE {role} WITH LOGIN PASSWORD '{pw}';\n"
        f"SELECT 'CREATE DATABASE {database} OWNER {role}' WHERE NOT EXISTS "
        f"(SELECT FROM pg_database WHERE datname = '{database}')\\gexec\n"
    )
    argv = [str(bindir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(_socket_dir(cluster)),
            "-p", str(port), "-d", "postgres", "-f", "-"]  # fmt: skip
    done = _run(cluster, argv, input=sql)
    if done.returncode != 0:
        raise StackError(f"could not create role/database {database}: {(done.stdout + done.stderr)[-1500:]}")


def create_store_database(home: Path, port: int, database: str = "odl_store", role: str = "odl") -> Path:
    """Role ``role`` and database ``database`` for the shared store (tasks/store/) in the running cluster
    of ``home``; the role's password is generated once into ``password-<role>`` (mode 0600) in the
    cluster folder, whose path is returned (ODL_STORE_PASSWORD_FILE). Idempotent."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", role) or not re.fullmatch(
        r"[a-z_][a-z0-9_]{0,62}", database
    ):
        raise StackError(f"store role {role!r} / database {database!r}: expected 1-63 chars of [a-z0-9_]")
    cluster = cluster_dir(Path(home))
    if cluster is None or _postmaster(cluster) is None:
        raise StackError(f"PostgreSQL of {home} is not running: start it first (odl stack up --db postgres)")
    pwfile = cluster / f"password-{role}"
    if not pwfile.is_file():
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(24) + "\n")
    _create_database(cluster, port, role, database, pwfile.name)
    return pwfile


def allow_network(home: Path, network: str) -> None:
    """Let clients of ``network`` (CIDR, e.g. the simulated hosts' 10.231.0.0/16) log in over TCP with
    a password: a line of the running cluster's pg_hba.conf (once), then a reload. The cluster must
    also listen beyond 127.0.0.1 (:func:`start`'s ``listen``)."""
    ipaddress.ip_network(network)  # ValueError on anything else: the line must not be free text
    cluster = cluster_dir(Path(home))
    if cluster is None or _postmaster(cluster) is None:
        raise StackError(f"PostgreSQL of {home} is not running: start it first")
    hba, line = cluster / "data" / "pg_hba.conf", f"host all all {network} scram-sha-256"
    if line not in hba.read_text().splitlines():
        with hba.open("a") as out:  # appended: the file keeps its owner (the server's user)
            out.write(line + "\n")
        done = _run(cluster, [str(bindir() / "pg_ctl"), "-D", str(cluster / "data"), "reload"])
        if done.returncode != 0:
            raise StackError(f"pg_ctl reload of {cluster} failed: {(done.stdout + done.stderr)[-1500:]}")


def query(home: Path, port: int, sql: str) -> str:
    """Run ``sql`` in database ``prefect`` as role ``prefect`` over TCP (password); unaligned output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGPASSWORD"] = password(home) or ""
    argv = [str(bindir() / "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
            "-p", str(port), "-U", "prefect", "-d", "prefect", "-c", sql]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise StackError(f"psql on 127.0.0.1:{port} failed: {done.stderr[-1500:]}")
    return done.stdout.strip()


def stop(home: Path, timeout: int = 30) -> bool:
    """Stop the cluster of ``home`` (fast shutdown) if it runs; whether it did. Keeps the data."""
    home = Path(home)
    cluster = cluster_dir(home)
    running = _postmaster(cluster)
    if running is None and running_pid(home, "postgres") is None:
        pidfile(home, "postgres").unlink(missing_ok=True)
        return False
    if running is not None:
        _run(cluster, [str(bindir() / "pg_ctl"), "-D", str(cluster / "data"), "-m", "fast", "-w",
                       "-t", str(timeout), "stop"])  # fmt: skip
    stop_service(home, "postgres", timeout)  # signals, if pg_ctl could not stop it
    pidfile(home, "postgres").unlink(missing_ok=True)
    return True


def status(home: Path) -> dict:
    """pid and port of the running postmaster (None when stopped) and the cluster folder."""
    cluster = cluster_dir(Path(home))
    running = _postmaster(cluster)
    return {"pid": running and running[0], "port": running and running[1], "cluster": cluster}


def remove(home: Path) -> None:
    """Stop the cluster and delete it (data, password) and the ``$ODL_HOME/postgres`` link."""
    home = Path(home)
    stop(home)
    cluster, link = cluster_dir(home), home / "postgres"
    if cluster is not None:
        shutil.rmtree(_socket_dir(cluster), ignore_errors=True)
        shutil.rmtree(cluster, ignore_errors=True)
    if link.is_symlink():
        link.unlink()
