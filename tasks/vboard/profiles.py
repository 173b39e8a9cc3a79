"""Board profiles: the limits of a virtual board that stands for a real board model.

``odl board up --profile stm32mp25`` gives the board what an STM32MP25 (STM32MP257F-DK/EV1) has,
enforced by the kernel: 4096 MB of RAM (a cgroup memory cap, no swap), 2 CPUs (taskset) and a
CPU quota that makes those two CPUs as slow as two Cortex-A35 cores. Any explicit flag
(``--mem-mb``, ``--cpus``, ``--cpu-quota``, ``--link``, ``--arch``, ``--ort``) overrides the profile's value.

``--profile stm32mp25-arm64`` is the same board running aarch64 code: an arm64 userland under qemu
user mode as a Cortex-A35 (:mod:`tasks.vboard.arm64`) with the plain onnxruntime X-LINUX-AI ships,
the RAM cap and CPUs of the board, and no CPU quota: emulation is already slower than the board
(a small train step ~30x, MobileNetV2 inference ~300x slower than native on this host).

Why a quota of 0.25 CPU (a slowdown of 8 per core)
--------------------------------------------------
The STM32MP25 runs two Arm Cortex-A35 cores at 1.5 GHz (ST's STM32MP25 datasheet). The A35 is an
in-order core whose Advanced SIMD (NEON) unit has a 64-bit datapath (Arm's Cortex-A35 technical
reference manual): a 128-bit single-precision FMA takes two cycles, so one core peaks at
4 FLOP/cycle x 1.5 GHz = 6 GFLOP/s and sustains about 4.5-5 in a tuned GEMM. The training
steps of this pipeline are GEMM/convolution bound (ONNX Runtime's MLAS kernels). On this project's
hosts (x86_64 with AVX2/FMA, 2 vCPUs) numpy's single-thread sgemm measured 39 GFLOP/s. The ratio is
39 / 4.8 ~ 8, so each of the board's two CPUs gets 1/8 of a host CPU: a quota of 2 / 8 = 0.25 CPU
for the whole board. It is an estimate from peak arithmetic, not a measurement on a board: the
A35's lower memory bandwidth makes a real board somewhat slower still on memory-bound layers. To
recalibrate, time the same training step on a real board and here and change ``SLOWDOWN``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.errors import BoardError

SLOWDOWN = 8  # one Cortex-A35 core at 1.5 GHz vs one host CPU (see above)
LIMITS = ("mem_mb", "cpus", "cpu_quota", "link", "arch", "ort")  # what a profile sets


@dataclass(frozen=True)
class Profile:
    """The limits of one board model (None: not limited)."""

    mem_mb: int | None = None
    cpus: int | None = None
    cpu_quota: float | None = None
    link: str | None = None
    arch: str | None = None  # None: x86_64, this machine's own (see tasks.vboard.boardenv)
    ort: str | None = None  # None: the training build
    about: str = ""


PROFILES: dict[str, Profile] = {
    "stm32mp25": Profile(
        mem_mb=4096,
        cpus=2,
        cpu_quota=2 / SLOWDOWN,
        about="STM32MP25: 4 GB RAM, 2 x Cortex-A35 @ 1.5 GHz (~1/8 of a host CPU each)",
    ),
    "stm32mp25-arm64": Profile(
        mem_mb=4096,
        cpus=2,
        arch="arm64",
        ort="plain",
        about="STM32MP25 running aarch64 code: 4 GB RAM, 2 CPUs, qemu user mode as a Cortex-A35, plain onnxruntime",
    ),
}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; BoardError naming ``--profile`` and the known names otherwise."""
    if name not in PROFILES:
        raise BoardError(f"--profile {name!r}: unknown board profile; known: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]


def resolve(profile: str | None, **explicit: Any) -> dict[str, Any]:
    """The board's limits: the profile's values, each replaced by an explicit one that is not None."""
    base = get_profile(profile) if profile else Profile()
    out = {key: getattr(base, key) for key in LIMITS}
    out.update({key: val for key, val in explicit.items() if val is not None})
    return out
