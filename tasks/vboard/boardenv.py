"""Which Python environment a virtual board runs: its architecture and its ONNX Runtime.

``odl board up`` takes two choices, both pinned by the project's files:

* ``--arch x86_64`` (default) or ``--arch arm64``: an x86_64 venv on this machine, or an arm64 Debian
  userland run by qemu user mode as a Cortex-A35 (:mod:`tasks.vboard.arm64`);
* ``--ort training`` (x86_64's default: ``deploy/board-requirements.txt``) or ``--ort plain`` /
  ``--ort plain==VERSION`` (arm64's default): numpy + a plain, inference-only ``onnxruntime`` of a
  version that ``deploy/board-requirements-plain.txt`` lists (its first one by default).

Every environment but the default one is built once and cached under ``$ODL_BOARD_ENVS`` (default
``$ODL_HOME/board-envs``), in a folder named by its architecture and ONNX Runtime version and
rebuilt when its pins change. What an environment can run is recorded in the board's inventory
entry: ``arch`` and ``runtimes`` (``ort``: the ONNX Runtime training API; ``autograd``: a train step
as a plain ONNX graph, run by any InferenceSession).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from tasks.board.check_items import PLAIN_REQUIREMENTS, pins
from tasks.errors import BoardError
from tasks.paths import odl_home
from tasks.vboard.arm64 import ensure_arm64_env
from tasks.vboard.venv import REQUIREMENTS, ensure_board_venv

ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
TRAINING, PLAIN = "training", "plain"
RUNTIMES = {TRAINING: ("ort-training", "autograd"), PLAIN: ("autograd",)}


@dataclass(frozen=True)
class EnvChoice:
    """A board environment: the machine it runs as and its ONNX Runtime build and version."""

    arch: str = "x86_64"
    ort: str = TRAINING
    version: str = ""

    @property
    def label(self) -> str:
        """``aarch64-onnxruntime-1.19.2``: the cached folder's name and the board state's."""
        build = "onnxruntime-training" if self.ort == TRAINING else "onnxruntime"
        return f"{self.arch}-{build}-{self.version}"


@dataclass(frozen=True)
class BoardEnv:
    """A built environment: the board user's python and what it can run."""

    python: str
    arch: str
    ort_version: str
    runtimes: tuple[str, ...]


def choose(arch: str = "x86_64", ort: str | None = None) -> EnvChoice:
    """The environment ``--arch ARCH --ort ORT`` names (no ``--ort``: the training build on x86_64,
    the plain one on aarch64, where no other exists); BoardError naming the option otherwise."""
    if arch not in ARCHES:
        raise BoardError(f"--arch {arch!r}: expected one of {', '.join(sorted(ARCHES))}")
    ort = ort if ort is not None else (PLAIN if ARCHES[arch] == "aarch64" else TRAINING)
    kind, sep, version = ort.partition("==")
    if kind not in (TRAINING, PLAIN) or (sep and not version):
        raise BoardError(f"--ort {ort!r}: expected 'training', 'plain' or 'plain==VERSION'")
    machine = ARCHES[arch]
    if kind == TRAINING:
        if machine == "aarch64":
            raise BoardError(
                "--ort training: onnxruntime-training has no aarch64 wheel; an arm64 board takes --ort plain[==VERSION]"
            )
        wanted = pins(REQUIREMENTS).get("onnxruntime-training-cpu", [""])[0]
        if version and version != wanted:
            raise BoardError(f"--ort {ort!r}: the training build is pinned to {wanted} ({REQUIREMENTS})")
        return EnvChoice(machine, TRAINING, wanted)
    supported = pins(PLAIN_REQUIREMENTS).get("onnxruntime", [])
    if not supported:
        raise BoardError(f"{PLAIN_REQUIREMENTS}: no onnxruntime==VERSION line")
    if version and version not in supported:
        raise BoardError(
            f"--ort {ort!r}: expected one of the versions {PLAIN_REQUIREMENTS.name} pins: {', '.join(supported)}"
        )
    return EnvChoice(machine, PLAIN, version or supported[0])


def envs_root() -> Path:
    """Where built board environments are cached: ``$ODL_BOARD_ENVS``, else ``$ODL_HOME/board-envs``."""
    return Path(os.environ.get("ODL_BOARD_ENVS") or odl_home() / "board-envs").resolve()


def check_reachable(folder: Path) -> None:
    """BoardError when another user (the board's) cannot reach ``folder``: an ancestor lacks o+x."""
    for parent in [folder, *folder.parents]:
        if parent.exists() and not stat.S_IMODE(parent.stat().st_mode) & stat.S_IXOTH:
            raise BoardError(
                f"board environments at {folder}: {parent} is closed to other users (mode "
                f"{stat.S_IMODE(parent.stat().st_mode):o}) and the board user must read them; "
                "set ODL_BOARD_ENVS to a folder they can reach (e.g. /var/tmp/odl-board-envs)"
            )


def ensure_env(choice: EnvChoice, default_venv: Path, envs: Path | None = None) -> BoardEnv:
    """Build (once) the environment ``choice`` names; returns its python and what it can run.

    The default x86_64 training venv is ``default_venv`` (as before); every other one is cached
    under ``envs`` (default :func:`envs_root`) in a folder named :attr:`EnvChoice.label`.
    """
    runtimes = RUNTIMES[choice.ort]
    if choice.ort == TRAINING:
        python = ensure_board_venv(default_venv)
        return BoardEnv(str(python), choice.arch, choice.version, runtimes)
    root = Path(envs or envs_root()).resolve()
    check_reachable(root)
    numpy = pins(PLAIN_REQUIREMENTS)["numpy"][0]
    dest = root / choice.label
    if choice.arch == "aarch64":
        python = ensure_arm64_env(dest, numpy, choice.version)
    else:
        python = ensure_board_venv(dest, (f"numpy=={numpy}", f"onnxruntime=={choice.version}"))
    return BoardEnv(str(python), choice.arch, choice.version, runtimes)
