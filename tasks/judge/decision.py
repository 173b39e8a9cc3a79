"""The promotion verdict: a candidate against its reference by the recipe's rule.

Promoted when the gain beats ``min_gain``, is significant on the paired test set (tasks.judge.gate)
and no guardrail regresses beyond its tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.errors import RegistryError
from tasks.judge.direction import LOWER_IS_BETTER
from tasks.judge.gate import guardrails, significance
from tasks.recipe.extras import PromotionSpec


@dataclass(frozen=True)
class Decision:
    """The promotion verdict for one candidate."""

    promote: bool
    metric: str
    candidate: float
    reference: float
    reference_name: str  # "base" or a version such as "v0003"
    gain: float  # improvement in the metric's better direction
    min_gain: float
    reason: str
    significance: dict[str, Any] | None = None  # the gate's paired test (tasks.judge.gate)
    guardrails: list[dict[str, Any]] = field(default_factory=list)  # each guardrail's verdict


def decide(
    candidate: dict[str, Any],
    reference: dict[str, Any],
    rule: PromotionSpec,
    reference_name: str,
    sets: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]] | None = None,
) -> Decision:
    """Compare a candidate's metrics with the reference's by the recipe's promotion rule.

    Promoted only when the gain beats ``min_gain``, is significant on the paired test set (unless
    ``rule.significance`` is None) and no guardrail regresses beyond its tolerance; ``sets`` gives
    the candidate's and the reference's metrics per test set for the guardrails (default: the
    main test set only).
    """
    metric = rule.metric
    for side, metrics in (("candidate", candidate), (reference_name, reference)):
        if not isinstance(metrics.get(metric), (int, float)):
            raise RegistryError(
                f"promotion.metric '{metric}': the {side} metrics have no such number "
                f"(have {sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))})"
            )
    label = _metric_label(metric, candidate, reference, reference_name)
    new, ref = float(candidate[metric]), float(reference[metric])
    gain = ref - new if metric in LOWER_IS_BETTER else new - ref
    enough = gain > rule.min_gain
    verb = "beats" if enough else "does not beat"
    reason = (
        f"{label} {new:.4f} vs {ref:.4f} ({reference_name}): gain {gain:+.4f} {verb} "
        f"the required min_gain {rule.min_gain:+.4f}"
    )
    test = significance(metric, candidate, reference, rule.significance) if rule.significance else None
    cand_sets, ref_sets = sets or ({"test": candidate}, {"test": reference})
    rails = guardrails(rule.guardrails, cand_sets, ref_sets)
    problems = (
        [] if test is None or test["significant"] else [f"the gain is not significant ({test['reason']})"]
    )
    problems += [f"guardrail {r['reason']}" for r in rails if not r["holds"]]
    if enough and problems:
        reason += ", but " + "; ".join(problems)
    elif test is not None:  # the paired test is reported whatever the verdict
        reason += f" ({test['reason']})"
    promote = enough and not problems
    return Decision(promote, metric, new, ref, reference_name, gain, rule.min_gain, reason, test, rails)


def _metric_label(
    metric: str, candidate: dict[str, Any], reference: dict[str, Any], reference_name: str
) -> str:
    """``metric`` as a reason names it: "loss (l1)" when the metrics say which loss they hold.

    Losses of different kinds are not comparable, so a candidate and a reference evaluated with
    different ``loss_kind`` are refused rather than judged.
    """
    if metric != "loss":
        return metric
    new, ref = candidate.get("loss_kind"), reference.get("loss_kind")
    known = {k for k in (new, ref) if k}
    if len(known) > 1:
        raise RegistryError(
            f"promotion.metric 'loss': the candidate's loss is {new} but {reference_name}'s is {ref}; "
            "evaluate both with the recipe's loss (tasks.judge.losses.host_loss)"
        )
    return f"loss ({known.pop()})" if known else "loss"


def decision_from_dict(d: dict[str, Any]) -> Decision:
    """Rebuild a Decision from ``asdict`` output (as stored in info.json or passed between tasks)."""
    return Decision(**d)
