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

This is the embedded backend of :class:`~tasks.judge.registry_base.ModelRegistry`; the shared one,
for several hosts, is :mod:`tasks.judge.registry_shared`, and :func:`tasks.judge.registry_open.open_registry`
chooses between them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tasks.errors import RegistryError
from tasks.hashing import file_sha256
from tasks.judge.decision import Decision, decide, decision_from_dict
from tasks.judge.registry_base import ModelRegistry, Version, candidate_files, check_names, version_info

log = logging.getLogger(__name__)

__all__ = ["Decision", "ModelRegistry", "Registry", "Version", "decide", "decision_from_dict"]

VERSION_RE = re.compile(r"^v(\d{4,})$")


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


class Registry(ModelRegistry):
    """The local model registry rooted at ``root`` (see the module docstring for the layout)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Registry({self.root})"

    def entry(self, recipe: str, board: str) -> Path:
        """The folder of one recipe+board pair (names are validated by the recipe's and the
        inventory's own rules, never used raw in paths)."""
        check_names(recipe, board)
        return self.root / f"{recipe}-{board}"

    def recipes(self, board: str) -> list[str]:
        """The recipes with a folder ``<recipe>-<board>``, sorted."""
        found = self.root.glob(f"*-{board}") if self.root.is_dir() else []
        return sorted(p.name[: -len(board) - 1] for p in found if p.is_dir())

    def versions(self, recipe: str, board: str) -> list[Version]:
        """Every recorded version, oldest first."""
        folder = self.entry(recipe, board)
        if not folder.is_dir():
            return []
        names = sorted(
            (p.name for p in folder.iterdir() if VERSION_RE.match(p.name)), key=lambda n: int(n[1:])
        )
        return [self._load(folder / n) for n in names]

    def version(self, recipe: str, board: str, name: str) -> Version:
        """The recorded version ``name``; RegistryError when there is no such version."""
        path = self.entry(recipe, board) / name
        if not VERSION_RE.match(name) or not path.is_dir():
            raise RegistryError(f"{recipe} on {board}: no version {name!r} in the registry")
        return self._load(path)

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
        """Store a candidate as the next version; move ``current`` to it only if promoted."""
        folder = self.entry(recipe, board)
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder, prefix=".staging-"))
        try:
            for name, src in candidate_files(model, manifest, extras).items():
                shutil.copy2(src, staging / name)
            _write_json(staging / "metrics.json", metrics)
            hashes = {p.name: file_sha256(p) for p in sorted(staging.iterdir()) if p.suffix != ".json"}
            _write_json(staging / "info.json", version_info(recipe, board, decision, hashes, info))
            path = self._claim_next(folder, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if decision.promote:
            self._set_current(recipe, board, path.name, "promoted")
        log.info(
            "registry %s: recorded %s (%s): %s",
            folder.name,
            path.name,
            "promoted" if decision.promote else "rejected",
            decision.reason,
        )
        return self._load(path)

    def history(self, recipe: str, board: str) -> list[dict[str, Any]]:
        """Every change of ``current``, oldest first: {version, action, at} (``history.jsonl``)."""
        path = self.entry(recipe, board) / "history.jsonl"
        if not path.is_file():  # a registry from before the history: its promotions in order
            return [
                {"version": v.name, "action": "promoted", "at": v.info.get("recorded_at")}
                for v in self.versions(recipe, board)
                if v.promoted
            ]
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def rollback(self, recipe: str, board: str) -> Version:
        """Put the previous version back in service; RegistryError when there is none."""
        current, previous = self.rollback_target(recipe, board)
        self._set_current(recipe, board, previous.name, f"rollback from {current.name}")
        log.info("registry %s-%s: rolled back %s -> %s", recipe, board, current.name, previous.name)
        return previous

    def _set_current(self, recipe: str, board: str, name: str, action: str) -> None:
        folder = self.entry(recipe, board)
        log_path = folder / "history.jsonl"
        if not log_path.is_file():  # keep the promotions of a registry from before the history
            past = [c for c in self.history(recipe, board) if c["version"] != name]
            log_path.write_text("".join(json.dumps(c) + "\n" for c in past))
        with open(log_path, "a") as log_file:
            log_file.write(json.dumps({"version": name, "action": action, "at": time.time()}) + "\n")
        _atomic_write(folder / "current", name + "\n")

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
