"""The board's own key for pull mode: made on the board by ``openssl``, never sent anywhere.

``ROOT/pull/board.key`` is an ECDSA P-256 private key (PEM, mode 0600, in a 0700 folder) made by
``openssl genpkey``; the host learns only its public half (``openssl pkey -pubout``), sent at
enrolment. :func:`sign` signs a request's :func:`~device_agent.pull.contract.signed_text` with
``openssl dgst -sha256 -sign``: a DER ECDSA-SHA256 signature, which the host verifies with the
enrolled public key. The agent holds no cryptography library of its own (standard library, numpy,
onnxruntime only), so every operation is one ``openssl`` run; a missing or failing ``openssl`` is
one line (exit ENVIRONMENT).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from device_agent.atomic import fsync_dir
from device_agent.errors import AgentError
from device_agent.protocol import ExitCode

PULL_DIR = "pull"
KEY_NAME = "board.key"
OPENSSL_TIMEOUT_S = 60


def pull_dir(root: Path) -> Path:
    """``ROOT/pull`` (mode 0700), created when missing; a symbolic link there is refused."""
    folder = root / PULL_DIR
    if folder.is_symlink():
        raise AgentError(ExitCode.INVALID_ARGUMENT, f"{folder} is a symbolic link; refusing to use it")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    except OSError as exc:
        raise AgentError(ExitCode.ENVIRONMENT, f"cannot create {folder}: {exc}") from exc
    return folder


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` whole with mode 0600 (a temporary file made 0600 before a byte is written, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def openssl(args: list[str], what: str, data: bytes = b"") -> bytes:
    """Run ``openssl ARGS`` with ``data`` on stdin; its stdout, or AgentError(ENVIRONMENT) in one line."""
    try:
        proc = subprocess.run(["openssl", *args], input=data, capture_output=True, timeout=OPENSSL_TIMEOUT_S)
    except FileNotFoundError:
        raise AgentError(
            ExitCode.ENVIRONMENT, f"{what}: the `openssl` command is not installed (pull mode needs it)"
        ) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AgentError(ExitCode.ENVIRONMENT, f"{what}: openssl {args[0]} did not run: {exc}") from exc
    if proc.returncode != 0 or not proc.stdout:
        lines = proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
        raise AgentError(
            ExitCode.ENVIRONMENT, f"{what}: openssl {args[0]} failed (exit {proc.returncode}): {lines[0]}"
        )
    return proc.stdout


class Identity:
    """The board's key under ``ROOT/pull``: made once (:meth:`ensure`), then used to sign."""

    def __init__(self, root: Path) -> None:
        self.key = pull_dir(root) / KEY_NAME

    def exists(self) -> bool:
        return self.key.is_file()

    def ensure(self) -> bool:
        """Make the key when there is none; True when it was made now."""
        if self.exists():
            return False
        pem = openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"], "board key")
        write_private(self.key, pem)
        return True

    def _need(self) -> str:
        if not self.exists():
            raise AgentError(
                ExitCode.INVALID_ARGUMENT, f"board key: no {self.key}: run `enrol` first (it makes the key)"
            )
        return str(self.key)

    def public_pem(self) -> str:
        """The public key (PEM, SubjectPublicKeyInfo): what the host enrols."""
        return openssl(["pkey", "-in", self._need(), "-pubout"], "board public key").decode()

    def sign(self, data: bytes) -> bytes:
        """The DER ECDSA-SHA256 signature of ``data``."""
        return openssl(["dgst", "-sha256", "-sign", self._need()], "request signature", data)
