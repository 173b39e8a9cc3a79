"""The fleet's differential privacy on the host (``[fleet.privacy]``): the central mean of clipped
updates with Gaussian noise, the local mode's job field, and ε from an accountant.

**Central** (``mode = "central"``): each board's update ``w_i - g`` (all trained tensors as one
vector) is clipped to L2 norm ``C`` (:func:`device_agent.privacy.clip`, the board's own code), the
clipped updates are summed, ``N(0, (z * C)^2)`` is added to every value of the sum, and the sum is
divided by the ``n`` updates: the center is ``g + (sum + noise) / n``. The sum's sensitivity to one
board (added or removed) is ``C``, so each round is a Gaussian mechanism of noise multiplier ``z``;
dividing by the round's count treats ``n`` as public, as DP-FedAvg does (McMahan et al., 2018).
Every update counts once: a board's sample count would otherwise scale its sensitivity.

**Local** (``mode = "local"``): the job spec carries ``clip`` and ``noise_multiplier``; each board
clips and noises its own update (:mod:`device_agent.privacy`) and each board's release is the same
Gaussian mechanism for its own data; the host's aggregation is post-processing.

**ε**: every round releases once for every board (sampling rate 1), so after ``k`` rounds ε is that
of ``k`` Gaussian mechanisms of multiplier ``z`` composed, for the recipe's δ, from Opacus's RDP
accountant (maintained by Meta; installs beside our pins with only opt-einsum added, where Google's
dp-accounting would pin attrs below 24 and Flower has none). Per-board figures the report shows
(norms, cosines, training loss) are not covered: central DP protects the released model only.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from device_agent.privacy import LocalPrivacy, clip
from tasks.errors import FleetError, RecipeError
from tasks.fleet.weights import Weights
from tasks.recipe.privacy import PrivacySpec

# RDP orders the accountant minimises over: Opacus's defaults (1.1 .. 63) widened both ways, so a small
# noise multiplier (optimal order near 1) and a large one (order past 63) get their tight bound
ALPHAS = tuple(
    sorted({1 + x / 1000 for x in range(1, 100)} | {1 + x / 10 for x in range(1, 100)} | set(range(12, 512)))
)


@functools.lru_cache(maxsize=4096)
def epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε after ``rounds`` releases of a Gaussian mechanism of ``noise_multiplier`` (sampling rate 1)
    for ``delta``, from Opacus's RDP accountant (0 for no round)."""
    if rounds <= 0:
        return 0.0
    # Opacus imports torch: only a private run pays for it, when it first asks
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, 1.0, rounds)]
    return float(accountant.get_epsilon(delta=delta, alphas=ALPHAS))


def rounds_within(spec: PrivacySpec, most: int) -> int:
    """How many rounds (at most ``most``) keep ε within ``spec.target_epsilon``."""
    k = 0
    while k < most and epsilon(spec.noise_multiplier, k + 1, spec.delta) <= spec.target_epsilon:
        k += 1
    return k


def check_budget(spec: PrivacySpec) -> None:
    """RecipeError naming ``fleet.privacy.target_epsilon`` when even one round would exceed it."""
    first = epsilon(spec.noise_multiplier, 1, spec.delta)
    if first > spec.target_epsilon:
        raise RecipeError(
            "fleet.privacy.target_epsilon",
            f"at least the ε of one round, {first:.3g} (noise_multiplier {spec.noise_multiplier:g}, "
            f"delta {spec.delta:g}); or raise fleet.privacy.noise_multiplier",
            spec.target_epsilon,
        )


def local_privacy(spec: PrivacySpec | None) -> LocalPrivacy | None:
    """The job spec's ``privacy`` for a local-mode recipe, else None."""
    if spec is None or spec.mode != "local":
        return None
    return LocalPrivacy(spec.clip, spec.noise_multiplier)


def central_center(
    global_w: Weights, updates: list[Weights], spec: PrivacySpec, rng: np.random.Generator
) -> tuple[Weights, dict[str, Any]]:
    """``g + (sum of clipped updates + N(0, (z C)^2)) / n`` (each tensor in its dtype) and the
    round's figures: how many updates were clipped and the noise's standard deviation on the mean."""
    if not updates:
        raise FleetError("no board update to aggregate")
    names = sorted(global_w)
    total = {k: np.zeros(global_w[k].shape, np.float64) for k in names}
    clipped = 0
    for w in updates:
        delta = {k: w[k].astype(np.float64) - global_w[k].astype(np.float64) for k in names}
        bounded, norm = clip(delta, spec.clip)
        clipped += norm > spec.clip
        for k in names:
            total[k] += bounded[k]
    std = spec.noise_multiplier * spec.clip
    n = len(updates)
    center = {
        k: (global_w[k].astype(np.float64) + (total[k] + rng.normal(0.0, std, total[k].shape)) / n).astype(
            global_w[k].dtype
        )
        for k in names
    }
    return center, {"clipped": int(clipped), "updates": n, "noise_std_of_mean": std / n}


def privacy_record(spec: PrivacySpec, rounds: int) -> dict[str, Any]:
    """What a round records of the budget: mode, clip, multiplier, δ, ε so far and the target."""
    return {
        "mode": spec.mode,
        "clip": spec.clip,
        "noise_multiplier": spec.noise_multiplier,
        "delta": spec.delta,
        "epsilon": epsilon(spec.noise_multiplier, rounds, spec.delta),
        "target_epsilon": spec.target_epsilon,
    }


def privacy_spent(spec: PrivacySpec | None, rounds: int, stopped: str = "") -> dict[str, Any] | None:
    """The run's privacy for the report and the registry: the budget's figures after ``rounds``
    (every round run counts, whether or not it reached its quorum) and why the rounds stopped."""
    if spec is None:
        return None
    return {**privacy_record(spec, rounds), "rounds": rounds, "stopped": stopped}
