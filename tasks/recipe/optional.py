"""Parsing of the recipe's optional tables: ``[head]``, ``[quantize]``, ``[detection]``, ``[fleet]``.

Each returns None for an absent (empty) table; every wrong field raises a RecipeError naming it.
"""

from __future__ import annotations

from pathlib import Path

from tasks.recipe.schema import (
    FLEET_STRATEGIES,
    QUANT_METHODS,
    DetectionSpec,
    FleetSpec,
    HeadSpec,
    QuantizeSpec,
)
from tasks.recipe.table import Table


def parse_head(t: Table) -> HeadSpec | None:
    if not t.d:
        return None
    pool = t.get("pool", str, "auto")
    if pool not in ("auto", "none"):
        raise t.err("pool", "'auto' or 'none'", pool)
    return HeadSpec(
        num_classes=t.number("num_classes", ..., 1, 100000, integer=True),
        hidden=t.number("hidden", 0, 0, 100000, integer=True),
        pool=pool,
        seed=t.number("seed", 0, 0, 2**31 - 1, integer=True),
    )


def parse_quantize(t: Table, base: Path) -> QuantizeSpec | None:
    if not t.d:
        return None
    method = t.get("method", str, "minmax")
    if method not in QUANT_METHODS:
        raise t.err("method", " or ".join(repr(m) for m in QUANT_METHODS), method)
    drop = t.get("max_drop", (int, float), None, "a number >= 0")
    if drop is not None and (isinstance(drop, bool) or drop < 0):
        raise t.err("max_drop", "a number >= 0", drop)
    return QuantizeSpec(
        calibration=t.path("calibration", base, required=True),  # type: ignore[arg-type]
        method=method,
        per_channel=t.get("per_channel", bool, True),
        samples=t.number("samples", 128, 1, 10**6, integer=True),
        max_drop=None if drop is None else float(drop),
    )


def parse_detection(t: Table, base: Path) -> DetectionSpec | None:
    if not t.d:
        return None
    classes = t.strings("classes")
    if not classes or len(set(classes)) != len(classes):
        raise t.err("classes", "a non-empty list of distinct object class names", list(classes) or None)
    threshold = t.number("score_threshold", 0.01, 0.0, 1.0)
    iou = t.number("iou_threshold", 0.45, 0.0, 1.0)
    if iou <= 0:
        raise t.err("iou_threshold", "a number in (0, 1]", iou)
    return DetectionSpec(
        classes=classes,
        priors=t.path("priors", base),
        scores_output=t.get("scores_output", str, "scores"),
        offsets_output=t.get("offsets_output", str, "offsets"),
        score_threshold=threshold,
        iou_threshold=iou,
        max_detections=int(t.number("max_detections", 100, 1, 10000, integer=True)),
    )


FLEET_KEYS = {"rounds", "min_boards", "deadline_s", "strategy", "server_lr", "momentum", "beta2", "tau"}


def parse_fleet(t: Table) -> FleetSpec:
    """``[fleet]`` (defaults when absent: 3 FedAvg rounds, quorum 1, 30 min per round)."""
    strategy = t.get("strategy", str, "fedavg")
    if strategy not in FLEET_STRATEGIES:
        raise t.err("strategy", " or ".join(repr(s) for s in FLEET_STRATEGIES), strategy)
    lr_default = 0.03 if strategy == "fedadam" else 1.0
    server_lr = t.number("server_lr", lr_default, 0.0, 100.0)
    if server_lr <= 0:
        raise t.err("server_lr", "a number > 0", server_lr)
    deadline = t.number("deadline_s", 1800.0, 0.0, 7 * 86400.0)
    if deadline <= 0:
        raise t.err("deadline_s", "seconds > 0", deadline)
    return FleetSpec(
        rounds=int(t.number("rounds", 3, 1, 1000, integer=True)),
        min_boards=int(t.number("min_boards", 1, 1, 10000, integer=True)),
        deadline_s=float(deadline),
        strategy=strategy,
        server_lr=float(server_lr),
        momentum=float(t.number("momentum", 0.9, 0.0, 0.999999)),
        beta2=float(t.number("beta2", 0.99, 0.0, 0.999999)),
        tau=float(t.number("tau", 1e-3, 1e-12, 10.0)),
    )
