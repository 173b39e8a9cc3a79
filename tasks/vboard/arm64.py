"""An aarch64 board environment on an x86_64 host: a Debian arm64 userland run by qemu user mode.

Built once into ``DEST`` (a folder of :mod:`tasks.vboard.boardenv`'s cache):

* ``DEST/rootfs``: ``mmdebstrap --variant=extract --arch=arm64`` of Debian's python3.11,
  libstdc++6, libgomp1 and ca-certificates (extract runs no maintainer scripts and needs no
  binfmt), with PyPI's aarch64 numpy and plain onnxruntime wheels in
  ``/usr/local/lib/python3.11/dist-packages`` (pip on the host, ``--platform manylinux..._aarch64``),
  the standard library and the wheels precompiled by the host's python of the same version, and an
  aarch64 ``/proc/cpuinfo`` (ONNX Runtime 1.32 under qemu 7.2 crashes on the host's x86 one);
* ``DEST/bin/python3``: the board user's python, a wrapper running
  ``qemu-aarch64-static -cpu cortex-a35 -0 WRAPPER -L ROOTFS ROOTFS/usr/bin/python3.11``. ``-0``
  makes ``sys.executable`` the wrapper, so the agent's child pythons start the same way (an
  aarch64 binary started by the kernel would fail: no binfmt). Other programs it starts run as host
  binaries, and a file missing in the rootfs is read from the host (the agent's root, /proc, /sys).

Empty ``dist-packages`` folders in the rootfs hide the host's Python packages from the board's
python. ``-L`` makes every path that exists in the rootfs win over the host's.
"""

from __future__ import annotations

import compileall
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from tasks.errors import BoardError
from tasks.vboard.owner import open_to_board_user
from tasks.vboard.sshd import ensure_installed
from tasks.vboard.venv import make_readable, run_step

log = logging.getLogger(__name__)

QEMU = "/usr/bin/qemu-aarch64-static"
MMDEBSTRAP = "/usr/bin/mmdebstrap"
SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3.11", "libstdc++6", "libgomp1", "ca-certificates")
PYTHON = "python3.11"
CPU = "cortex-a35"
WHEEL_PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_27_aarch64", "manylinux_2_28_aarch64")
SITE = "usr/local/lib/python3.11/dist-packages"
HIDDEN = (SITE, "usr/lib/python3/dist-packages")  # empty in the rootfs: the host's never show through
STAMP_NAME = ".odl-board-env"
BUILD_RECIPE = 1  # raise when the steps below change: cached rootfs are rebuilt


def arm64_stamp(numpy_pin: str, ort_version: str) -> str:
    """What a built rootfs is made of (suite, packages, wheels, steps): it is rebuilt when this changes."""
    parts = (
        str(BUILD_RECIPE),
        SUITE,
        *DEBIAN_PACKAGES,
        CPU,
        f"numpy=={numpy_pin}",
        f"onnxruntime=={ort_version}",
    )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@open_to_board_user()
def ensure_arm64_env(dest: Path, numpy_pin: str, ort_version: str) -> Path:
    """Build (once; concurrent callers wait for one) the arm64 environment at ``dest``; returns its
    ``bin/python3`` wrapper. A second call with the same pins returns at once."""
    dest = Path(dest)
    wrapper = dest / "bin" / "python3"
    stamp = arm64_stamp(numpy_pin, ort_version)
    if _is_current(dest, stamp):
        return wrapper
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(dest.parent, os.stat(dest.parent).st_mode | 0o055)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_current(dest, stamp):
            _build(dest, numpy_pin, ort_version, stamp)
    return wrapper


def _is_current(dest: Path, stamp: str) -> bool:
    stamp_file = dest / STAMP_NAME
    return (
        (dest / "bin" / "python3").exists()
        and stamp_file.exists()
        and stamp_file.read_text().strip() == stamp
    )


def _build(dest: Path, numpy_pin: str, ort_version: str, stamp: str) -> None:
    ensure_installed(QEMU, "qemu-user-static")
    ensure_installed(MMDEBSTRAP, "mmdebstrap")
    start = time.monotonic()
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    rootfs = partial / "rootfs"
    partial.mkdir(mode=0o755)
    what = f"the arm64 board environment {dest.name}"
    log.info(
        "building %s: Debian %s arm64 userland, numpy %s, onnxruntime %s", what, SUITE, numpy_pin, ort_version
    )
    run_step([MMDEBSTRAP, "--quiet", "--variant=extract", "--arch=arm64", f"--include={','.join(DEBIAN_PACKAGES)}",
              SUITE, str(rootfs)], what)  # fmt: skip
    for folder in HIDDEN:
        (rootfs / folder).mkdir(parents=True, exist_ok=True)
    install_wheels(rootfs, [f"numpy=={numpy_pin}", f"onnxruntime=={ort_version}"], what)
    write_cpuinfo(rootfs / "proc" / "cpuinfo", os.cpu_count() or 1)
    precompile(rootfs)
    write_wrapper(partial / "bin" / "python3", dest / "bin" / "python3", dest / "rootfs")
    make_readable(partial)
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    (dest / STAMP_NAME).write_text(stamp + "\n")
    os.chmod(dest / STAMP_NAME, 0o644)
    size_mb = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20
    log.info("built %s in %.0f s (%.0f MB)", what, time.monotonic() - start, size_mb)


def install_wheels(rootfs: Path, requirements: list[str], what: str) -> None:
    """Install PyPI's aarch64 CPython 3.11 wheels of ``requirements`` (no dependencies) into the
    rootfs's dist-packages with the host's pip; ``--isolated`` ignores this machine's pip settings."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--isolated", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
            "--abi", "cp311", "--target", str(rootfs / SITE), "--no-compile"]  # fmt: skip
    for platform in WHEEL_PLATFORMS:
        argv += ["--platform", platform]
    run_step([*argv, *requirements], what)
    shutil.rmtree(rootfs / SITE / "bin", ignore_errors=True)  # console scripts of the host's pip


def write_cpuinfo(path: Path, cpus: int) -> None:
    """An aarch64 ``/proc/cpuinfo`` of ``cpus`` Cortex-A35 cores (ARM implementer 0x41, part 0xd04)."""
    core = (
        "BogoMIPS\t: 48.00\n"
        "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\n"
        "CPU part\t: 0xd04\nCPU revision\t: 2\n\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"processor\t: {i}\n{core}" for i in range(cpus)))


def precompile(rootfs: Path) -> None:
    """Byte-compile the rootfs's standard library and wheels with this host's python when it is the
    rootfs's version (bytecode is the same on every machine): the board user cannot write them, and
    compiling them on every import under qemu would cost seconds per process."""
    if f"python{sys.version_info[0]}.{sys.version_info[1]}" != PYTHON:
        log.info(
            "not precompiling the arm64 rootfs: host python %s is not %s", sys.version.split()[0], PYTHON
        )
        return
    for folder in ("usr/lib/python3.11", SITE):
        compileall.compile_dir(str(rootfs / folder), quiet=2, stripdir=str(rootfs), prependdir="/", workers=1)


def write_wrapper(path: Path, final: Path, rootfs: Path) -> None:
    """The board user's ``python3``: qemu running the rootfs's python as a Cortex-A35 (``final``: the
    wrapper's path once built, which ``sys.executable`` reports)."""
    for where in (final, rootfs):
        if any(c in str(where) for c in " \t\n'\"\\$`"):
            raise BoardError(
                f"arm64 board environment: path {where} has a space or quote; use a plain folder"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n# The board's python: Debian arm64 python3.11 run by qemu user mode as a Cortex-A35.\n"
        f'exec {QEMU} -cpu {CPU} -0 {final} -L {rootfs} {rootfs}/usr/bin/{PYTHON} "$@"\n'
    )
    path.chmod(0o755)
