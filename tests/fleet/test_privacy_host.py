"""The host's side of the fleet's differential privacy (tasks.fleet.privacy): the central mean of
clipped updates and its noise on generated tensors, ε from the accountant, and the budget's refusal."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.errors import RecipeError
from tasks.fleet.privacy import ALPHAS, central_center, check_budget, epsilon, local_privacy, rounds_within
from tasks.recipe.privacy import PrivacySpec


def _spec(**kw) -> PrivacySpec:
    base = {"target_epsilon": 10.0, "delta": 1e-5, "clip": 1.0, "noise_multiplier": 1.0}
    return PrivacySpec(**{**base, **kw})


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.floats(0.05, 5), st.floats(0.1, 4))
def test_the_center_is_the_mean_of_clipped_updates_plus_noise_of_z_c_over_n(seed, n, clip, z):
    rng = np.random.default_rng(seed)
    g = {"w": rng.standard_normal((30, 40)).astype(np.float32), "b": rng.standard_normal(9)}
    ups = [{k: (v + rng.uniform(0.01, 3) * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in g.items()}
           for _ in range(n)]  # fmt: skip
    center, figures = central_center(
        g, ups, _spec(clip=clip, noise_multiplier=z), np.random.default_rng(seed + 1)
    )
    assert {k: v.dtype for k, v in center.items()} == {k: v.dtype for k, v in g.items()}
    clipped_sum = {k: np.zeros(v.shape) for k, v in g.items()}
    over = 0
    for u in ups:
        d = {k: u[k].astype(np.float64) - g[k] for k in g}
        norm = math.sqrt(sum(float(np.sum(v**2)) for v in d.values()))
        over += norm > clip
        for k in g:
            clipped_sum[k] += d[k] * min(1.0, clip / norm)
    # (center - g) * n - the clipped sum is the noise on the sum: N(0, (z clip)^2) everywhere
    noise = np.concatenate([((center[k].astype(np.float64) - g[k]) * n - clipped_sum[k]).ravel() for k in g])
    tol = 6 / math.sqrt(2 * noise.size) + (2e-3 if n > 1 else 1e-3)  # float32 rounding of the center
    assert abs(noise.std() / (z * clip) - 1) < tol
    assert abs(noise.mean()) < 6 * z * clip / math.sqrt(noise.size) + 1e-3 * z * clip
    assert figures == {"clipped": over, "updates": n, "noise_std_of_mean": pytest.approx(z * clip / n)}


def test_epsilon_is_the_accountants_round_by_round_and_grows():
    from opacus.accountants import RDPAccountant

    accountant, eps = RDPAccountant(), []
    for r in range(1, 6):
        accountant.step(noise_multiplier=1.3, sample_rate=1.0)
        eps.append(accountant.get_epsilon(delta=1e-6, alphas=ALPHAS))
        assert epsilon(1.3, r, 1e-6) == pytest.approx(eps[-1], rel=1e-9)
        assert eps[-1] <= accountant.get_epsilon(delta=1e-6)  # the wider orders only tighten it
    assert eps == sorted(eps) and epsilon(1.3, 0, 1e-6) == 0.0
    assert rounds_within(_spec(noise_multiplier=1.3, delta=1e-6, target_epsilon=eps[2]), 10) == 3
    assert rounds_within(_spec(noise_multiplier=1.3, delta=1e-6, target_epsilon=eps[2]), 2) == 2


def test_a_target_below_one_round_is_a_recipe_error_naming_the_field():
    one = epsilon(1.0, 1, 1e-5)
    with pytest.raises(
        RecipeError, match=r"fleet.privacy.target_epsilon.*at least the ε of one round"
    ) as err:
        check_budget(_spec(target_epsilon=one * 0.9))
    assert err.value.field == "fleet.privacy.target_epsilon"
    check_budget(_spec(target_epsilon=one))


def test_only_local_mode_goes_into_the_job_spec():
    assert local_privacy(None) is None and local_privacy(_spec()) is None
    p = local_privacy(_spec(mode="local", clip=0.3, noise_multiplier=2.0))
    assert (p.clip, p.noise_multiplier) == (0.3, 2.0)


def test_central_noise_with_a_robust_strategy_is_refused_at_load():
    from tasks.recipe.extras import FleetSpec

    privacy = {"target_epsilon": 5.0, "delta": 1e-5, "clip": 1.0, "noise_multiplier": 1.0}
    with pytest.raises(RecipeError, match=r"fleet.strategy.*with central privacy"):
        FleetSpec(strategy="median", privacy=privacy)
    FleetSpec(strategy="median", privacy={**privacy, "mode": "local"})
