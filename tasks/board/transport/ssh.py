"""SSH transport to a board: strict host keys, keys only, a socket that notices a dead link.

Every remote command is an argv list with each argument ``shlex.quote``-d; uploads and downloads
stream through exec channels (``cat``), about twice SFTP's throughput here. Socket and paramiko
failures become :mod:`tasks.errors` values here and nowhere else.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko

from tasks.board.inventory import Board
from tasks.board.transport.base import ByteProgress, Result, Transport, quote_argv
from tasks.board.transport.host_keys import pinned_keys
from tasks.errors import DeviceUnreachable, HostKeyRejected, RemoteCommandFailed, TransferError

log = logging.getLogger(__name__)

USER_TIMEOUT_MS = 10_000
WINDOW = 16 * 1024 * 1024
PACKET = 256 * 1024
STREAM_CHUNK = 1024 * 1024
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")


def dead_link_socket(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection whose writes fail ~10 s after the link dies (TCP_USER_TIMEOUT + keepalive)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise DeviceUnreachable(f"cannot connect to {host}:{port}: {exc}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def hold_paramiko_logs() -> None:
    """Hold paramiko's loggers: its own lines repeat what this module's errors say (its reader
    thread logs "Socket exception: Bad file descriptor" at ERROR when a session closes under it),
    so they show only when the host logs debug lines (``odl -v``). Called at each connection, after
    the host's logging is set up."""
    debug = logging.getLogger().isEnabledFor(logging.DEBUG)
    logging.getLogger("paramiko").setLevel(logging.DEBUG if debug else logging.CRITICAL + 1)


def _fast_transport(sock: socket.socket, **kwargs: object) -> paramiko.Transport:
    t = paramiko.Transport(sock, default_window_size=WINDOW, default_max_packet_size=PACKET, **kwargs)
    opts = t.get_security_options()
    opts.ciphers = [c for c in CIPHERS if c in opts.ciphers] + [c for c in opts.ciphers if c not in CIPHERS]
    return t


@contextlib.contextmanager
def link_errors(board: str, what: str) -> Iterator[None]:
    """Map socket/SSH failures inside the block to DeviceUnreachable."""
    try:
        yield
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise DeviceUnreachable(
            f"board {board}: link lost during {what}: {exc or type(exc).__name__}"
        ) from exc


class SSHTransport(Transport):
    """A paramiko connection to one board of the inventory (RejectPolicy, keys only)."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.client = self._connect()
        self._sftp: paramiko.SFTPClient | None = None

    def _connect(self) -> paramiko.SSHClient:
        b = self.board
        if b.known_hosts is None or not Path(b.known_hosts).exists():
            raise HostKeyRejected(
                f"board {b.name}: no pinned known_hosts file ({b.known_hosts}); refusing to connect"
            )
        hold_paramiko_logs()
        client = paramiko.SSHClient()
        own = client.get_host_keys()  # this board's pinned keys only (see pinned_keys)
        for keytype, key in pinned_keys(Path(b.known_hosts), b.host, b.port):
            own.add(b.host if b.port == 22 else f"[{b.host}]:{b.port}", keytype, key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        sock = dead_link_socket(b.host, b.port, b.connect_timeout)
        try:
            client.connect(
                b.host,
                port=b.port,
                username=b.user,
                key_filename=str(b.key),
                sock=sock,
                look_for_keys=False,
                allow_agent=False,
                timeout=b.connect_timeout,
                banner_timeout=b.connect_timeout,
                auth_timeout=b.connect_timeout,
                transport_factory=_fast_transport,
            )
        except paramiko.BadHostKeyException as exc:
            sock.close()
            raise HostKeyRejected(
                f"board {b.name}: host key CHANGED for {b.host}:{b.port} "
                f"(got {exc.key.get_name()} {exc.key.fingerprint}); refusing"
            ) from exc
        except paramiko.AuthenticationException as exc:
            sock.close()
            raise DeviceUnreachable(f"board {b.name}: key authentication failed as {b.user}: {exc}") from exc
        except paramiko.SSHException as exc:
            sock.close()
            if "not found in known_hosts" in str(exc):
                raise HostKeyRejected(
                    f"board {b.name}: host {b.host}:{b.port} is not in {b.known_hosts}"
                ) from exc
            raise DeviceUnreachable(f"board {b.name}: SSH handshake failed: {exc}") from exc
        except (OSError, EOFError) as exc:
            sock.close()
            raise DeviceUnreachable(f"board {b.name}: cannot connect: {exc}") from exc
        client.get_transport().set_keepalive(5)
        return client

    @property
    def sftp(self) -> paramiko.SFTPClient:
        """The connection's SFTP session, opened on first use."""
        if self._sftp is None:
            with link_errors(self.board.name, "sftp open"):
                self._sftp = self.client.open_sftp()
                self._sftp.get_channel().settimeout(60)
        return self._sftp

    def run(
        self, argv: list[str], *, input: bytes | None = None, check: bool = True, timeout: float | None = 600
    ) -> Result:
        """Run ``argv`` on the board (no pty: the process survives a closed channel)."""
        cmd = quote_argv(argv)
        log.debug("%s$ %s", self.board.name, cmd)
        with link_errors(self.board.name, f"'{cmd[:80]}'"):
            chan = self.client.get_transport().open_session(timeout=self.board.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(cmd)
            if input is not None:
                chan.sendall(input)
            chan.shutdown_write()
            out, err = _drain(chan, timeout)
            code = chan.recv_exit_status()
            chan.close()
        res = Result(argv, code, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and code != 0:
            raise RemoteCommandFailed(argv, code, res.stderr or res.stdout)
        return res

    def put(self, local: Path, remote: str, progress: ByteProgress | None = None) -> None:
        """Upload ``local`` to ``remote``, streamed through an exec channel (``cat > remote``).

        Streaming avoids SFTP's per-32 KB request round trips (about twice SFTP's throughput
        here); integrity is checked by the caller (sha256 verified on the board before use).
        """
        total = Path(local).stat().st_size
        with _transfer(self.board.name, f"upload {local} -> {remote}"):
            chan = self._stream(["sh", "-c", 'cat > "$1"', "sh", remote])
            try:
                _send_file(chan, Path(local), total, progress)
            except OSError as exc:  # the remote side ended first (e.g. disk full): say why
                raise OSError(f"{exc}; remote: {_remote_stderr(chan) or 'no message'}") from exc
            chan.shutdown_write()
            self._finish(chan, f"upload to {remote}")

    def get(self, remote: str, local: Path, progress: ByteProgress | None = None) -> None:
        """Download ``remote`` to ``local`` (``cat remote`` on an exec channel); no partial file on failure."""
        try:
            with _transfer(self.board.name, f"download {remote} -> {local}"):
                chan = self._stream(["cat", remote])
                with open(local, "wb") as dst:
                    done = 0
                    while chunk := chan.recv(STREAM_CHUNK):
                        dst.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, done)
                self._finish(chan, f"download of {remote}")
        except BaseException:
            Path(local).unlink(missing_ok=True)
            raise

    def _stream(self, argv: list[str]) -> paramiko.Channel:
        chan = self.client.get_transport().open_session(
            window_size=WINDOW, max_packet_size=PACKET, timeout=self.board.connect_timeout
        )
        chan.settimeout(60)
        chan.exec_command(quote_argv(argv))
        return chan

    def _finish(self, chan: paramiko.Channel, what: str) -> None:
        code = chan.recv_exit_status()
        err = chan.recv_stderr(65536).decode(errors="replace") if chan.recv_stderr_ready() else ""
        chan.close()
        if code != 0:
            raise TransferError(f"board {self.board.name}: {what} failed (exit {code}): {err.strip()}")

    def exists(self, remote: str) -> bool:
        """True when ``remote`` exists on the board."""
        with link_errors(self.board.name, f"stat {remote}"):
            try:
                self.sftp.stat(remote)
                return True
            except FileNotFoundError:
                return False

    def read_from(self, remote: str, offset: int) -> bytes:
        """The bytes of ``remote`` from ``offset`` to its current end (b'' when absent)."""
        with link_errors(self.board.name, f"read {remote}"):
            try:
                with self.sftp.open(remote, "rb") as f:
                    f.seek(offset)
                    return f.read()
            except FileNotFoundError:
                return b""

    def close(self) -> None:
        """Close the SFTP session and the connection (never raises)."""
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        with contextlib.suppress(Exception):
            self.client.close()


@contextlib.contextmanager
def _transfer(board: str, what: str) -> Iterator[None]:
    try:
        yield
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise TransferError(f"board {board}: {what} failed: {exc or type(exc).__name__}") from exc


def _send_file(chan: paramiko.Channel, local: Path, total: int, progress: ByteProgress | None) -> None:
    with open(local, "rb") as src:
        done = 0
        while chunk := src.read(STREAM_CHUNK):
            chan.sendall(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)


def _remote_stderr(chan: paramiko.Channel) -> str:
    """What an exec channel's remote process wrote on stderr before it ended (best effort)."""
    with contextlib.suppress(Exception):
        deadline = time.monotonic() + 2.0
        while not chan.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        if chan.recv_stderr_ready():
            return chan.recv_stderr(65536).decode(errors="replace").strip()
    return ""


def _drain(chan: paramiko.Channel, timeout: float | None) -> tuple[bytes, bytes]:
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout if timeout else None
    while True:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"remote command still running after {timeout} s")
        got = False
        while chan.recv_ready():
            out += chan.recv(65536)
            got = True
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
            got = True
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            if chan.eof_received or chan.closed:
                return bytes(out), bytes(err)
        if not got:
            r, _, _ = select.select([chan], [], [], 0.2)
            if not r and chan.get_transport() is not None and not chan.get_transport().is_active():
                raise EOFError("SSH transport closed")
