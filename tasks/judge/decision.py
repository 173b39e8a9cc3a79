"""The promotion verdict: a candidate against its reference by the recipe's rule, as one list of checks.

A :class:`Decision` carries every check the gate made - ``min_gain``, the significance of the gain,
each guardrail (the recipe's and the default guard of every extra test set), the int8 model's -
with its figures (``figures``: a table cell), a few words when it fails (``short``) and a sentence
(``text``). The candidate is promoted when every check holds. Its ``reason`` is
:func:`render_checks` of that list, failing checks first, kept whole in the registry entry; the
flow's state message, the report and ``odl registry`` lead with :func:`headline` (the metric's
figures and the failing checks' few words, one line) and give each failing check's sentence on
the lines after it, so they cannot tell different stories.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass, field
from typing import Any

from tasks.errors import RegistryError
from tasks.judge.direction import LOWER_IS_BETTER
from tasks.judge.gate import class_checks, guardrails, objects_check, significance
from tasks.recipe.extras import PromotionSpec

Check = dict[str, Any]  # {"kind", "name", "holds", "text", "figures", "short", ...}: one check of the gate
HEADLINE_CHARS = 150  # a headline's length at most: one readable line with its version in front
LINE_CHARS = 158  # a line of the details under it
SHORTLIST_MIN = 16  # the narrowest room a shortlist of failing checks is given


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
    reason: str  # render_checks(checks), failing first
    significance: dict[str, Any] | None = None  # the gate's paired test (tasks.judge.gate); None: off
    guardrails: list[dict[str, Any]] = field(default_factory=list)  # each guardrail's verdict
    checks: list[Check] = field(default_factory=list)  # every check, in the order they were made

    def failing(self) -> list[Check]:
        """The checks that do not hold."""
        return [c for c in self.checks if not c["holds"]]


def render_checks(checks: list[Check]) -> str:
    """The checks as one line, failing first: "FAIL guardrail loss: ...; ok min_gain: ..."."""
    ordered = [c for c in checks if not c["holds"]] + [c for c in checks if c["holds"]]
    return "; ".join(f"{'ok' if c['holds'] else 'FAIL'} {c['name']}: {c['text']}" for c in ordered)


def headline(d: Decision, width: int = HEADLINE_CHARS) -> str:
    """The verdict in one line of at most ``width`` characters: the metric's figures and, when a check
    fails, their few words ("accuracy 0.7005 vs 0.6904 (v0001), gain +0.0102; fails: not significant
    (p=0.42), guardrail loss"), those that do not fit counted (:func:`shortlist`)."""
    label = next((c.get("label") for c in d.checks if c.get("kind") == "min_gain"), None) or d.metric
    line = f"{label} {d.candidate:.4f} vs {d.reference:.4f} ({d.reference_name}), gain {d.gain:+.4f}"
    failing = [c.get("short") or c["name"] for c in d.failing()]
    room = width - len(line) - len("; fails: ")
    if not failing or room < SHORTLIST_MIN:
        return (f"{line}; {len(failing)} checks fail" if failing else line)[:width]
    return f"{line}; fails: {shortlist(failing, room)}"


def shortlist(items: list[str], width: int, sep: str = ", ") -> str:
    """As many of ``items`` as fit in ``width`` (at least SHORTLIST_MIN) characters, joined by ``sep``,
    then "+N more" for the others; when not even the first fits, the first cut short with "…"."""
    for keep in range(len(items), 0, -1):
        more = len(items) - keep
        text = sep.join(items[:keep]) + (f" +{more} more" if more else "")
        if len(text) <= width:
            return text
    more = f" +{len(items) - 1} more" if len(items) > 1 else ""
    return items[0][: max(width - len(more) - 1, 0)] + "…" + more if items else ""


def details(d: Decision, indent: str = "  ", width: int = LINE_CHARS) -> list[str]:
    """The failing checks' sentences, each wrapped to ``width``: what follows a :func:`headline`."""
    return [
        line
        for c in d.failing()
        for line in textwrap.wrap(f"FAIL {c['name']}: {c['text']}", width, initial_indent=indent,
                                  subsequent_indent=indent * 3, break_on_hyphens=False)
    ]  # fmt: skip


def verdict_message(version: str, d: Decision, served: str = "") -> str:
    """A flow's final state message: "v0003: <headline><served>", then :func:`details`' lines."""
    width = max(HEADLINE_CHARS - len(served), HEADLINE_CHARS // 2)  # a long "served" goes past it
    return "\n".join([f"{version}: {headline(d, width)}{served}", *details(d)])


def with_check(decision: Decision, check: Check) -> Decision:
    """``decision`` with one more check (the int8 model's, ...): promoted only if it holds too."""
    checks = [*decision.checks, check]
    return dataclasses.replace(
        decision,
        checks=checks,
        promote=decision.promote and check["holds"],
        reason=render_checks(checks),
    )


def same_scores(candidate: dict[str, Any], reference: dict[str, Any]) -> bool:
    """The candidate scores exactly as the reference on every quality metric both have (the
    latency and the size, which vary between measurements, left out)."""
    shared = [k for k, v in candidate.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
              and isinstance(reference.get(k), (int, float)) and not k.startswith(("latency", "model_size"))]  # fmt: skip
    return bool(shared) and all(float(candidate[k]) == float(reference[k]) for k in shared)


def _short_gain(gain: float, candidate: dict[str, Any], reference: dict[str, Any]) -> str:
    """The min_gain check's few words in a headline when it fails."""
    if same_scores(candidate, reference):
        return "same scores as the reference (the same model)"
    return "no gain" if gain == 0 else "gain below min_gain"


def gain_sentence(gain: float, min_gain: float, reference_name: str, same: bool) -> str:
    """What the gain means against ``min_gain``: beats it, falls short of it, is no gain at all, or is
    no gain because the candidate scores exactly as the reference (a re-run on the same data)."""
    if gain > min_gain:
        return f"gain {gain:+.4f} beats the required {min_gain:+.4f}"
    if same:
        return (f"no gain: the candidate scores exactly as {reference_name} on every metric, as a re-run "
                f"on the same data and recipe does (training is seeded, so it trains the same model); "
                f"new data, other settings or another [training].seed give a different candidate")  # fmt: skip
    if gain == 0:
        return (
            f"no gain over {reference_name} (the same figure); promotion needs a gain above {min_gain:+.4f}"
        )
    return f"gain {gain:+.4f} does not beat the required {min_gain:+.4f}"


def decide(
    candidate: dict[str, Any],
    reference: dict[str, Any],
    rule: PromotionSpec,
    reference_name: str,
    sets: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]] | None = None,
) -> Decision:
    """Compare a candidate's metrics with the reference's by the recipe's promotion rule.

    Promoted only when the gain beats ``min_gain``, is significant on the paired test set (unless
    ``rule.significance`` is None: "off", said in the check) and no guardrail regresses beyond its
    tolerance; ``sets`` gives the candidate's and the reference's metrics per test set for the
    guardrails (default: the main test set only). Every extra test set is guarded on the promotion
    metric with ``rule.extra_tests_tolerance`` unless a guardrail names it or the tolerance is off.
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
    checks: list[Check] = [
        {
            "kind": "min_gain", "name": "min_gain", "holds": enough, "gain": gain, "min_gain": rule.min_gain,
            "short": _short_gain(gain, candidate, reference), "label": label,
            "figures": f"{new:.4f} vs {ref:.4f}: gain {gain:+.4f} (min {rule.min_gain:+g})",
            "text": f"{label} {new:.4f} vs {ref:.4f} ({reference_name}): "
                    + gain_sentence(gain, rule.min_gain, reference_name, same_scores(candidate, reference)),
        }
    ]  # fmt: skip
    test = significance(metric, candidate, reference, rule.significance) if rule.significance else None
    if test is None:
        checks.append({"kind": "significance", "name": "significance", "holds": True, "tested": False,
                       "figures": "not tested (off)",
                       "text": f"not tested (the recipe sets significance = \"off\" for {metric})"})  # fmt: skip
    else:
        checks.append({"kind": "significance", "name": "significance", "test": test["test"],
                       "holds": bool(test["significant"]), "tested": test.get("test") != "none",
                       "text": test["reason"], "short": _short_test(test), "figures": test.get("figures", "")})  # fmt: skip
    objects = objects_check(candidate, reference, test, rule.significance)
    if objects is not None:
        checks.append(objects)
        checks += class_checks(candidate, reference, rule.class_tolerance, rule.min_class_iou)
    cand_sets, ref_sets = sets or ({"test": candidate}, {"test": reference})
    rules = guarded_rules(rule, cand_sets, ref_sets)
    rails = guardrails(rules, cand_sets, ref_sets)
    checks += [
        {"kind": "guardrail", "name": f"guardrail {r['rule']}", "short": f"guardrail {r['rule']}", "holds": r["holds"],
         "drop": r["regression"] > 0, "text": r["reason"], "default": r["rule"] not in rule.guardrails,
         "figures": r["figures"]}
        for r in rails
    ]  # fmt: skip
    promote = all(c["holds"] for c in checks)
    return Decision(
        promote,
        metric,
        new,
        ref,
        reference_name,
        gain,
        rule.min_gain,
        render_checks(checks),
        test,
        rails,
        checks,
    )


def _short_test(test: dict[str, Any]) -> str:
    """A failed test in a few words: "not significant (p=0.31)", "(CI [-0.01, +0.02])", "untested"."""
    if test.get("test") == "none":
        return "no significance test for the metric"
    if "p_value" in test:
        return f"not significant (p={test['p_value']:.2g})"
    return f"not significant (CI [{test['low']:+.3g}, {test['high']:+.3g}])"


def guarded_rules(
    rule: PromotionSpec, candidate: dict[str, dict[str, Any]], reference: dict[str, dict[str, Any]]
) -> dict[str, float]:
    """The recipe's guardrails plus, for each extra test set none of them names, ``"<set>.<metric>"``
    at ``extra_tests_tolerance`` (the promotion metric where the set reports it, else its loss):
    what the model knew is not lost silently."""
    rules = dict(rule.guardrails)
    if rule.extra_tests_tolerance is None:
        return rules
    named = {r.rpartition(".")[0] for r in rules}
    for name in candidate:
        if name == "test" or name in named or name not in reference:
            continue
        both = (candidate[name], reference[name])
        metric = rule.metric if all(isinstance(m.get(rule.metric), (int, float)) for m in both) else "loss"
        rules[f"{name}.{metric}"] = rule.extra_tests_tolerance
    return rules


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
