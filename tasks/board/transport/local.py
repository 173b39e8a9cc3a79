"""A board on this machine: the agent root is a local folder and commands run as this user.

Chosen by ``transport = "local"`` in an inventory entry. It runs exactly the argv the SSH
transport would send (agent install, blob listing, ``device_agent start`` ...), so the board code,
the pipeline stages and the flow are tested without root, sshd or a network.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tasks.board.transport.base import ByteProgress, Result, Transport
from tasks.errors import DeviceUnreachable, RemoteCommandFailed, TransferError

CHUNK = 1024 * 1024


class LocalTransport(Transport):
    """The :class:`~tasks.board.transport.base.Transport` interface on this machine."""

    def __init__(self, name: str = "local") -> None:
        self.name = name

    def run(
        self, argv: list[str], *, input: bytes | None = None, check: bool = True, timeout: float | None = 600
    ) -> Result:
        """Run ``argv`` locally without a shell."""
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise DeviceUnreachable(f"board {self.name}: command still running after {timeout} s") from exc
        res = Result(
            argv, proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        )
        if check and proc.returncode != 0:
            raise RemoteCommandFailed(argv, proc.returncode, res.stderr or res.stdout)
        return res

    def put(self, local: Path, remote: str, progress: ByteProgress | None = None) -> None:
        """Copy ``local`` to ``remote`` (reporting progress like an upload)."""
        self._copy(Path(local), Path(remote), progress, f"upload {local} -> {remote}")

    def get(self, remote: str, local: Path, progress: ByteProgress | None = None) -> None:
        """Copy ``remote`` to ``local``; no partial file on failure."""
        try:
            self._copy(Path(remote), Path(local), progress, f"download {remote} -> {local}")
        except BaseException:
            Path(local).unlink(missing_ok=True)
            raise

    def exists(self, remote: str) -> bool:
        """True when ``remote`` exists."""
        return Path(remote).exists()

    def read_from(self, remote: str, offset: int) -> bytes:
        """Bytes of ``remote`` from ``offset`` on (b'' when absent)."""
        try:
            with open(remote, "rb") as f:
                f.seek(offset)
                return f.read()
        except FileNotFoundError:
            return b""

    def close(self) -> None:
        """Nothing to close."""

    def _copy(self, src: Path, dst: Path, progress: ByteProgress | None, what: str) -> None:
        try:
            total = src.stat().st_size
            done = 0
            with open(src, "rb") as fin, open(dst, "wb") as fout:
                while chunk := fin.read(CHUNK):
                    fout.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
        except OSError as exc:
            raise TransferError(f"board {self.name}: {what} failed: {exc}") from exc
