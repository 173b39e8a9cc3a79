"""Judging stages: which model the candidate must beat, host evaluation, promotion.

The reference is the registry's current version for the recipe and board, or the base model
(the untrained checkpoint, exported exactly as the board exports) before the first promotion.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.judge.registry import Decision, Registry
from tasks.paths import state_dir
from tasks.prepare import Prepared
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)

Metrics = dict[str, Any]


@dataclass(frozen=True)
class Reference:
    """The model a candidate must beat: ``name`` is "base" or a registry version ("v0003")."""

    name: str
    model: Path | None = None  # the current version's model; None for "base"

    @property
    def column(self) -> str:
        """Its column in the evaluation: "current" or "base"."""
        return "base" if self.model is None else "current"


@dataclass(frozen=True)
class Evaluation:
    """Metrics per test set ("test" first, then the extra sets) and per model column."""

    reference: Reference
    sets: dict[str, dict[str, Metrics]] = field(default_factory=dict)  # set -> column -> metrics

    @property
    def test(self) -> dict[str, Metrics]:
        """The main test set's columns (base, current if any, candidate)."""
        return self.sets["test"]


@dataclass(frozen=True)
class Promotion:
    """The verdict and the registry version the candidate was recorded as."""

    decision: Decision
    version: str


def registry() -> Registry:
    """The model registry under ``$ODL_HOME/registry``."""
    return Registry(state_dir("registry"))


def choose_reference(recipe: str, board: str, reg: Registry | None = None) -> Reference:
    """The current version of ``recipe`` on ``board``, else the base model."""
    current = (reg or registry()).current(recipe, board)
    return Reference(current.name, current.model) if current else Reference("base")


def base_model(prep: Prepared) -> Path:
    """The untrained checkpoint exported as an inference model (``base_inference.onnx``)."""
    from tasks.judge.evaluate import base_inference_model

    arts = prep.artifacts_dir
    return base_inference_model(
        arts / "training_model.onnx",
        arts / "eval_model.onnx",
        arts / "checkpoint",
        prep.manifest["inference_output_names"],
        prep.out_dir / "base_inference.onnx",
    )


def evaluate(recipe: Recipe, prep: Prepared, candidate: Path, reference: Reference) -> Evaluation:
    """Base, current (when there is one) and candidate on the test set and every extra test set.

    Every model is scored with the recipe's own loss (``loss``, named in ``loss_kind``): the built-in
    kind it trains with, or its custom or embedded loss run by the prepared eval graph with that
    model's weights; the current version is evaluated again, so it is compared on the same loss.
    """
    from tasks.judge.evaluate import evaluate_cached
    from tasks.judge.losses import host_loss

    models = {"base": base_model(prep)}
    if reference.model is not None:
        models["current"] = reference.model
    models["candidate"] = Path(candidate)
    sets = {"test": recipe.data.test, **recipe.data.extra_tests}
    cache, loss = state_dir("cache", "evaluations"), host_loss(recipe, prep)
    detector = {"detection": recipe.detection, "priors": prep.priors} if recipe.detection else {}
    return Evaluation(
        reference,
        {
            name: {
                col: evaluate_cached(m, path, recipe.task, cache, loss, **detector)
                for col, m in models.items()
            }
            for name, path in sets.items()
        },
    )


def promote(
    recipe: Recipe,
    board: str,
    evaluation: Evaluation,
    candidate: Path,
    prep: Prepared,
    info: dict[str, Any],
    reg: Registry | None = None,
) -> Promotion:
    """Record the candidate; it becomes current only if it beats the evaluation's reference."""
    from tasks.judge.registry import decide

    ref = evaluation.reference
    test = evaluation.test
    decision = decide(test["candidate"], test[ref.column], recipe.promotion, ref.name)
    version = (reg or registry()).record(
        recipe.name,
        board,
        Path(candidate),
        test["candidate"],
        decision,
        info=info,
        manifest=prep.manifest_path,
        extras={"priors.npy": prep.priors} if recipe.detection else None,
    )
    return Promotion(decision, version.name)
