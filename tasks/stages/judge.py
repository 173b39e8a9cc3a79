"""Judging stages: which model the candidate must beat, host evaluation, promotion.

The reference is the registry's current version for the recipe and board, or the base model
(the untrained checkpoint, exported exactly as the board exports) before the first promotion.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.judge.continual import heldout_sets
from tasks.judge.decision import with_check
from tasks.judge.detection import teacher_box_metrics
from tasks.judge.evaluate import base_inference_model, evaluate_cached, judged_as
from tasks.judge.losses import GRAPH_LOSSES, host_loss, task_loss
from tasks.judge.quantize import int8_verdict, quantize_int8
from tasks.judge.registry import Decision, ModelRegistry, decide
from tasks.judge.registry_open import open_registry
from tasks.paths import state_dir
from tasks.prepare import Prepared
from tasks.prepare.runtimes.autograd.template import inference_of as autograd_inference
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
    int8: dict[str, Any] | None = None  # the quantized candidate: file, sizes, verdict (when [quantize])
    heldout: tuple[str, ...] = ()  # the sets that are learnt board shards' held-out parts

    @property
    def test(self) -> dict[str, Metrics]:
        """The main test set's columns (base, current if any, candidate)."""
        return self.sets["test"]


@dataclass(frozen=True)
class Promotion:
    """The verdict and the registry version the candidate was recorded as."""

    decision: Decision
    version: str


def registry() -> ModelRegistry:
    """The model registry this host is configured for: the shared store when ``ODL_STORE_URL`` is set
    (refused in one line without valid credentials), else ``$ODL_HOME/registry``."""
    return open_registry()


def choose_reference(recipe: str, board: str, reg: ModelRegistry | None = None) -> Reference:
    """The current version of ``recipe`` on ``board``, else the base model."""
    current = (reg or registry()).current(recipe, board)
    return Reference(current.name, current.model) if current else Reference("base")


def base_model(prep: Prepared) -> Path:
    """The untrained checkpoint exported as an inference model (``base_inference.onnx``)."""
    return inference_of(prep, prep.checkpoint, prep.out_dir / "base_inference.onnx")


def inference_of(prep: Prepared, checkpoint: Path, out: Path) -> Path:
    """A checkpoint of the prepared artifacts exported as an inference model, exactly as the
    board exports after training."""
    if prep.manifest.get("runtime") == "autograd":  # the template with the checkpoint's tensors
        return autograd_inference(prep.out_dir, prep.manifest, checkpoint, out)
    arts = prep.artifacts_dir
    return base_inference_model(
        arts / "training_model.onnx",
        arts / "eval_model.onnx",
        checkpoint,
        prep.manifest["inference_output_names"],
        out,
    )


def evaluate(
    recipe: Recipe, prep: Prepared, candidate: Path, reference: Reference, learnt: Sequence[str] = ()
) -> Evaluation:
    """Base, current (when there is one) and candidate on the test set, every extra test set and
    the held-out part of each ``learnt`` board shard (``[data] heldout``, :mod:`tasks.judge.continual`).

    Every model is scored with the recipe's own loss (``loss``, named in ``loss_kind``): the built-in
    kind it trains with, or its custom or embedded loss run by the prepared eval graph with that
    model's weights; the current version is evaluated again, so it is compared on the same loss.
    """
    teacher = recipe.teacher
    models = {"teacher": teacher.model} if teacher and teacher.labels != "boxes" else {}  # beside the student
    models["base"] = base_model(prep)
    if reference.model is not None:
        models["current"] = reference.model
    models["candidate"] = Path(candidate)
    heldout = heldout_sets(recipe.data.heldout, learnt)
    sets = {"test": recipe.data.test, **recipe.data.extra_tests, **heldout}
    cache, loss = state_dir("cache", "evaluations"), host_loss(recipe, prep)
    detector = judged_as(recipe, prep.priors)
    int8 = quantize(recipe, Path(candidate)) if recipe.quantize else None
    if int8 is not None:
        models[INT8] = Path(int8["path"])
    columns = {
        name: {
            col: evaluate_cached(
                m,
                path,
                recipe.task,
                cache,
                int8_loss(recipe, loss) if col == INT8 else loss,
                batch_size=1 if col == INT8 else 64,
                **detector,
            )  # fmt: skip
            for col, m in models.items()
        }
        for name, path in sets.items()
    }
    if teacher is not None and teacher.labels == "boxes":  # a detector teacher's mAP, by the board's box code
        columns["test"] = {
            "teacher": teacher_box_metrics(teacher.model, recipe.data.test, recipe),
            **columns["test"],
        }
    if int8 is not None:
        spec = recipe.quantize
        int8["verdict"] = int8_verdict(
            columns["test"]["candidate"], columns["test"][INT8], recipe.promotion.metric, spec.max_drop
        )
    return Evaluation(reference, columns, int8, tuple(heldout))


INT8 = "candidate int8"  # the quantized candidate's column


def recorded_metrics(metrics: Metrics) -> Metrics:
    """The candidate's metrics as the registry keeps them: a detector's or keypoints' per-image COCO
    matches and a segmentation's per-image confusion matrices (the gate's bootstrap input, megabytes
    on a large test set) stay in the evaluation cache."""
    bulky = ("detection", "segmentation", "keypoints")  # per image: the bootstrap's input, kept in the cache
    per_sample = {k: v for k, v in (metrics.get("per_sample") or {}).items() if k not in bulky}
    return {**metrics, "per_sample": per_sample}


def quantize(recipe: Recipe, candidate: Path) -> dict[str, Any]:
    """The candidate as a static int8 QDQ model (batch 1) beside it: ``inference.int8.onnx``."""
    assert recipe.quantize is not None
    return quantize_int8(candidate, recipe.quantize, candidate.with_name("inference.int8.onnx"))


def int8_loss(recipe: Recipe, loss: Any) -> Any:
    """The int8 model's loss: the recipe's built-in kind; a graph loss (custom) cannot take
    quantized weights, so the task's usual loss stands in (named in ``loss_kind``)."""
    return task_loss(recipe.task) if loss.kind in GRAPH_LOSSES else loss


def promote(
    recipe: Recipe,
    board: str,
    evaluation: Evaluation,
    candidate: Path,
    prep: Prepared,
    info: dict[str, Any],
    reg: ModelRegistry | None = None,
) -> Promotion:
    """Record the candidate; it becomes current only if it beats the evaluation's reference."""
    ref = evaluation.reference
    test = evaluation.test
    named = {r.rpartition(".")[0] for r in recipe.promotion.guardrails}
    judged = {n: cols for n, cols in evaluation.sets.items() if n not in evaluation.heldout or n in named}
    sets = (  # held-out shard parts are reported, guarded only when a guardrail names them
        {name: cols["candidate"] for name, cols in judged.items()},
        {name: cols[ref.column] for name, cols in judged.items()},
    )
    decision = decide(test["candidate"], test[ref.column], recipe.promotion, ref.name, sets)
    extras = {"priors.npy": prep.priors} if recipe.detection else {}
    metrics = recorded_metrics(test["candidate"])
    if evaluation.heldout:  # what the candidate knows of each learnt shard (the nightly report's matrix)
        metric = recipe.promotion.metric
        cand = {s: evaluation.sets[s]["candidate"] for s in evaluation.heldout}
        if not all(isinstance(m.get(metric), (int, float)) for m in cand.values()):
            metric = "loss"
        metrics["heldout"] = {s: m[metric] for s, m in cand.items()}
        metrics["heldout_metric"] = metric
    if evaluation.int8 is not None:
        verdict = evaluation.int8["verdict"]
        decision = with_check(  # the NPU model must hold up too
            decision,
            {
                "kind": "int8",
                "short": "int8 model does not hold up",
                "name": "int8 model",
                "holds": bool(verdict["holds"]),
                "text": verdict["reason"],
                "figures": f"int8 {verdict['int8']:.4f} vs float {verdict['float']:.4f}"
                + ("" if verdict["max_drop"] is None else f" (max drop {verdict['max_drop']:g})"),
            },
        )
        extras["model.int8.onnx"] = Path(evaluation.int8["path"])
        metrics["int8"] = {**test[INT8], "quantization": evaluation.int8}
    version = (reg or registry()).record(
        recipe.name,
        board,
        Path(candidate),
        metrics,
        decision,
        info=info,
        manifest=prep.manifest_path,
        extras=extras or None,
    )
    return Promotion(decision, version.name)
