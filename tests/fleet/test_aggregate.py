"""Server-side aggregation (tasks.fleet.aggregate) against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import FleetError
from tasks.fleet.aggregate import ServerState, aggregate, weighted_mean
from tasks.recipe.schema import FleetSpec


def _w(v: float) -> dict[str, np.ndarray]:
    return {"a": np.full((2,), v, np.float32), "b": np.array([[v]], np.float32)}


def test_fedavg_weights_by_samples():
    got = aggregate(_w(0.0), [(_w(1.0), 30), (_w(4.0), 10)], FleetSpec(strategy="fedavg"), ServerState())
    # (30 * 1 + 10 * 4) / 40 = 1.75, whatever the global model was
    assert np.allclose(got["a"], 1.75) and np.allclose(got["b"], 1.75)
    assert got["a"].dtype == np.float32


def test_fedavg_with_a_server_learning_rate_moves_part_of_the_way():
    got = aggregate(_w(1.0), [(_w(3.0), 1)], FleetSpec(server_lr=0.5), ServerState())
    assert np.allclose(got["a"], 2.0)


def test_fedavgm_accumulates_momentum_across_rounds():
    spec, state = FleetSpec(strategy="fedavgm", server_lr=1.0, momentum=0.5), ServerState()
    w1 = aggregate(_w(0.0), [(_w(1.0), 5)], spec, state)  # m = 1 -> w = 1
    w2 = aggregate(w1, [(_w(2.0), 5)], spec, state)  # delta 1, m = 0.5 * 1 + 1 = 1.5 -> w = 2.5
    assert np.allclose(w1["a"], 1.0) and np.allclose(w2["a"], 2.5) and state.rounds == 2


def test_fedadam_follows_reddi_et_al():
    spec = FleetSpec(strategy="fedadam", server_lr=0.1, momentum=0.9, beta2=0.99, tau=1e-3)
    state = ServerState()
    got = aggregate(_w(0.0), [(_w(2.0), 1)], spec, state)
    m, v = 0.1 * 2.0, 0.01 * 4.0  # (1 - b1) * delta, (1 - b2) * delta**2
    assert np.allclose(got["a"], 0.1 * m / (np.sqrt(v) + 1e-3), rtol=1e-6)
    assert np.allclose(state.v["a"], v)


def test_mismatched_updates_are_refused():
    with pytest.raises(FleetError, match="different tensors"):
        weighted_mean([(_w(1.0), 1), ({"a": np.zeros(2, np.float32)}, 1)])
    with pytest.raises(FleetError, match="no training samples"):
        weighted_mean([(_w(1.0), 0)])
    with pytest.raises(FleetError, match="no board update"):
        weighted_mean([])
