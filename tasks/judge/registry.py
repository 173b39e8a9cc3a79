"""A local model registry: one folder per recipe+board, numbered versions, an atomic ``current``.

Layout under the registry root (default ``$ODL_HOME/registry``)::

    <recipe>-<board>/
        current                 text file naming the version in service (e.g. "v0002"); replaced
                                atomically (write a temp file, then os.replace)
        v0001/                  one folder per candidate, never overwritten
            model.onnx          the inference model
            manifest.json       the prepare manifest of the run (copied when given)
            metrics.json        host evaluation of the candidate
            info.json           flow run id, recipe hash, input hashes, decision, reason, time
        v0002/ ...

Every candidate is recorded, promoted or not; only a promotion moves ``current``. A candidate is
promoted when it beats the reference (the current version, or the base model on a first run) by
the recipe's rule: ``new - ref > min_gain`` (for lower-is-better metrics ``ref - new > min_gain``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tasks.board.inventory import valid_board_name
from tasks.errors import BoardError, RegistryError
from tasks.recipe.load import NAME_RE as RECIPE_NAME_RE
from tasks.recipe.schema import PromotionSpec

log = logging.getLogger(__name__)

LOWER_IS_BETTER = frozenset(
    {"loss", "mse", "mae", "latency_ms_per_sample", "latency_ms_batch1", "model_size_bytes"}
)
VERSION_RE = re.compile(r"^v(\d{4,})$")


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


@dataclass(frozen=True)
class Version:
    """One recorded candidate in the registry."""

    name: str
    path: Path
    info: dict[str, Any]
    metrics: dict[str, Any]

    @property
    def model(self) -> Path:
        """The version's inference model."""
        return self.path / "model.onnx"

    @property
    def promoted(self) -> bool:
        """Whether this candidate was promoted when it was recorded."""
        return bool(self.info.get("promoted"))


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
    from tasks.judge.gate import guardrails, significance

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
    elif enough and test is not None:
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


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Registry:
    """The model registry rooted at ``root`` (see the module docstring for the layout)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def entry(self, recipe: str, board: str) -> Path:
        """The folder of one recipe+board pair (names are validated by the recipe's and the
        inventory's own rules, never used raw in paths)."""
        if not isinstance(recipe, str) or not RECIPE_NAME_RE.match(recipe):
            raise RegistryError(f"recipe name {recipe!r}: expected 1-64 chars of [a-z0-9_-]")
        try:
            valid_board_name(board)
        except BoardError as exc:
            raise RegistryError(str(exc)) from exc
        return self.root / f"{recipe}-{board}"

    def versions(self, recipe: str, board: str) -> list[Version]:
        """Every recorded version, oldest first."""
        folder = self.entry(recipe, board)
        if not folder.is_dir():
            return []
        names = sorted(
            (p.name for p in folder.iterdir() if VERSION_RE.match(p.name)), key=lambda n: int(n[1:])
        )
        return [self._load(folder / n) for n in names]

    def current(self, recipe: str, board: str) -> Version | None:
        """The version in service, or None before the first promotion."""
        pointer = self.entry(recipe, board) / "current"
        if not pointer.is_file():
            return None
        name = pointer.read_text().strip()
        if not VERSION_RE.match(name) or not (pointer.parent / name).is_dir():
            raise RegistryError(f"{pointer}: points at {name!r}, which is not a recorded version")
        return self._load(pointer.parent / name)

    def record(
        self,
        recipe: str,
        board: str,
        model: Path,
        metrics: dict[str, Any],
        decision: Decision,
        *,
        info: dict[str, Any] | None = None,
        manifest: Path | None = None,
        extras: dict[str, Path] | None = None,
    ) -> Version:
        """Store a candidate as the next version; move ``current`` to it only if promoted.

        ``extras`` are files the model needs beside it, stored under their given names (a
        detector's ``priors.npy``, which its board application decodes boxes with)."""
        folder = self.entry(recipe, board)
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder, prefix=".staging-"))
        try:
            shutil.copy2(model, staging / "model.onnx")
            if manifest is not None:
                shutil.copy2(manifest, staging / "manifest.json")
            for name, extra in (extras or {}).items():
                shutil.copy2(extra, staging / name)
            _write_json(staging / "metrics.json", metrics)
            full = {
                **(info or {}),
                "recipe": recipe,
                "board": board,
                "promoted": decision.promote,
                "reason": decision.reason,
                "decision": asdict(decision),
                "recorded_at": time.time(),
            }
            _write_json(staging / "info.json", full)
            path = self._claim_next(folder, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if decision.promote:
            _atomic_write(folder / "current", path.name + "\n")
        log.info(
            "registry %s: recorded %s (%s): %s",
            folder.name,
            path.name,
            "promoted" if decision.promote else "rejected",
            decision.reason,
        )
        return self._load(path)

    def _claim_next(self, folder: Path, staging: Path) -> Path:
        """Rename the staging folder to the next free version name (rename fails if it exists)."""
        taken = [int(p.name[1:]) for p in folder.iterdir() if VERSION_RE.match(p.name)]
        number = max(taken, default=0) + 1
        for _ in range(100):
            target = folder / f"v{number:04d}"
            try:
                os.rename(staging, target)  # atomic; refuses an existing non-empty folder
                return target
            except OSError:
                number += 1
        raise RegistryError(f"{folder}: could not claim a new version folder")

    @staticmethod
    def _load(path: Path) -> Version:
        try:
            info = json.loads((path / "info.json").read_text())
            metrics = json.loads((path / "metrics.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RegistryError(f"{path}: unreadable version ({exc})") from exc
        return Version(path.name, path, info, metrics)
