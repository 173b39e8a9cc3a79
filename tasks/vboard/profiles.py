"""Board profiles: the limits of a virtual board that stands for a real board model.

``odl board up --profile stm32mp25`` gives the board what an STM32MP25 (STM32MP257F-DK/EV1) has,
enforced by the kernel: 4096 MB of RAM (a cgroup memory cap, no swap), 2 CPUs (taskset) and a
CPU quota that makes those two CPUs as slow as two Cortex-A35 cores. Any explicit flag
(``--mem-mb``, ``--cpus``, ``--cpu-quota``, ``--link``) overrides the profile's value.

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


@dataclass(frozen=True)
class Profile:
    """The limits of one board model (None: not limited)."""

    mem_mb: int | None = None
    cpus: int | None = None
    cpu_quota: float | None = None
    link: str | None = None
    about: str = ""


PROFILES: dict[str, Profile] = {
    "stm32mp25": Profile(
        mem_mb=4096,
        cpus=2,
        cpu_quota=2 / SLOWDOWN,
        about="STM32MP25: 4 GB RAM, 2 x Cortex-A35 @ 1.5 GHz (~1/8 of a host CPU each)",
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
    out = {key: getattr(base, key) for key in ("mem_mb", "cpus", "cpu_quota", "link")}
    out.update({key: val for key, val in explicit.items() if val is not None})
    return out
