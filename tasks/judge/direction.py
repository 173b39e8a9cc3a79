"""Which way a metric improves: lower for the metrics named here, higher for every other one.

Below the promotion verdict (:mod:`tasks.judge.decision`), its statistics (:mod:`tasks.judge.gate`),
the registry, the trend and the int8 check, which all need it.
"""

from __future__ import annotations

LOWER_IS_BETTER = frozenset(
    {"loss", "mse", "mae", "latency_ms_per_sample", "latency_ms_batch1", "model_size_bytes"}
)
