"""Local differential privacy on the board (device_agent.privacy): the clipping and the Gaussian
noise on generated tensors, and the job spec's ``privacy`` on the wire."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from device_agent.privacy import LocalPrivacy, clip, l2_norm, privatize
from device_agent.wire import SpecError

DTYPES = (np.float16, np.float32, np.float64)


@st.composite
def tensors(draw: st.DrawFn, min_size: int = 1) -> dict[str, np.ndarray]:
    """1-3 named arrays of random shapes and float dtypes, values from a random scale."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 50.0]))
    out = {}
    for i in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(1, 6), max_size=3)))
        dtype = DTYPES[draw(st.integers(0, 2))]
        out[f"t{i}"] = (rng.standard_normal(shape) * scale).astype(dtype)
    return out


@settings(max_examples=150, deadline=None)
@given(tensors(), st.floats(1e-3, 100))
@example({"a": np.zeros(3, np.float32)}, 1.0)  # no update: nothing to scale
@example({"a": np.array([3.0, 4.0])}, 5.0)  # exactly at the bound: unchanged
def test_clipping_bounds_the_whole_update_and_keeps_its_direction(delta, bound):
    clipped, norm = clip(delta, bound)
    flat = np.concatenate([v.astype(np.float64).ravel() for v in delta.values()])
    assert math.isclose(norm, float(np.linalg.norm(flat)), rel_tol=1e-9, abs_tol=1e-12)
    got = np.concatenate([clipped[k].ravel() for k in delta])
    assert float(np.linalg.norm(got)) <= bound * (1 + 1e-9)
    if norm <= bound:
        assert np.array_equal(got, flat)  # within the bound: untouched
    else:
        assert math.isclose(float(np.linalg.norm(got)), bound, rel_tol=1e-9)
        assert np.allclose(got * norm / bound, flat, rtol=1e-9, atol=1e-12)  # same direction


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.floats(0.01, 10),
    st.floats(0.1, 5),
    st.sampled_from([np.float32, np.float64]),
)
def test_the_noise_is_centred_gaussian_of_std_multiplier_times_clip(seed, bound, z, dtype):
    rng = np.random.default_rng(seed)
    start = {"w": rng.standard_normal((40, 60)).astype(dtype), "b": rng.standard_normal(7).astype(dtype)}
    trained = {k: (v + 10 * rng.standard_normal(v.shape)).astype(dtype) for k, v in start.items()}
    out = privatize(start, trained, LocalPrivacy(bound, z), np.random.default_rng(seed + 1))
    assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in trained.items()}
    delta = {k: trained[k].astype(np.float64) - start[k].astype(np.float64) for k in start}
    clipped, _ = clip(delta, bound)
    noise = np.concatenate([(out[k].astype(np.float64) - start[k] - clipped[k]).ravel() for k in start])
    n, std = noise.size, z * bound
    # 6-sigma bounds on the sample mean and the sample standard deviation of n normal draws
    assert abs(noise.mean()) < 6 * std / math.sqrt(n) + 1e-3 * std * (dtype == np.float32)
    assert abs(noise.std() / std - 1) < 6 / math.sqrt(2 * n) + 1e-3 * (dtype == np.float32)


def test_fresh_noise_each_time_from_the_system_and_the_same_for_one_seed():
    start, trained = {"a": np.zeros(100)}, {"a": np.ones(100)}
    p = LocalPrivacy(1.0, 1.0)
    a = privatize(start, trained, p, np.random.default_rng(7))["a"]
    assert np.array_equal(a, privatize(start, trained, p, np.random.default_rng(7))["a"])
    fresh = [privatize(start, trained, p, np.random.default_rng())["a"] for _ in range(2)]
    assert not np.array_equal(*fresh)
    assert l2_norm({"a": a}) > 1.0  # the noise is there (norm of 100 N(0, 1) draws ~ 10)


def test_the_wire_form_round_trips_and_refuses_bad_values_naming_the_field():
    p = LocalPrivacy(0.5, 1.2)
    assert LocalPrivacy.from_dict(p.to_dict()) == p
    for bad, field in (({"clip": 0, "noise_multiplier": 1}, "privacy.clip"),
                       ({"clip": 1, "noise_multiplier": float("nan")}, "privacy.noise_multiplier"),
                       ({"clip": 1}, "privacy.noise_multiplier"),
                       ({"clip": 1, "noise_multiplier": 1, "seed": 3}, "privacy")):  # fmt: skip
        with pytest.raises(SpecError) as err:
            LocalPrivacy.from_dict(bad)
        assert err.value.field.startswith(field)
