"""The model registry's one interface (:class:`ModelRegistry`) and its versions (:class:`Version`).

Two backends implement it: :class:`tasks.judge.registry.Registry`, a folder under
``$ODL_HOME/registry`` (one host, the embedded default), and
:class:`tasks.judge.registry_shared.SharedRegistry`, on the shared store (PostgreSQL) that every host
configured with the same ``ODL_STORE_URL`` sees. :func:`tasks.judge.registry_open.open_registry`
picks one. What they share is written here once: the names' rules, what a recorded version's info
holds, and the rollback stack read from the history of ``current``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tasks.board.inventory import valid_board_name
from tasks.errors import BoardError, RegistryError
from tasks.hashing import file_sha256
from tasks.judge.decision import Decision
from tasks.judge.registry_cache import materialize
from tasks.recipe.load import NAME_RE as RECIPE_NAME_RE


@dataclass(frozen=True)
class Version:
    """One recorded candidate in the registry. ``folder`` holds its files; for a version of the shared
    registry, ``files`` (name -> sha256) are fetched into it from the store on first access of
    :attr:`path` (nothing of the store itself is kept here: a Version may be pickled or logged)."""

    name: str
    folder: Path
    info: dict[str, Any]
    metrics: dict[str, Any]
    files: dict[str, str] | None = None

    @property
    def path(self) -> Path:
        """The version's folder, its files present and verified."""
        if self.files is not None:
            materialize(self.folder, self.files, self.info, self.metrics)
        return self.folder

    @property
    def model(self) -> Path:
        """The version's inference model."""
        return self.path / "model.onnx"

    @property
    def promoted(self) -> bool:
        """Whether this candidate was promoted when it was recorded."""
        return bool(self.info.get("promoted"))

    def verified_files(self, names: tuple[str, ...], hint: str = "") -> dict[str, tuple[Path, str]]:
        """Those of ``names`` the version holds, with their sha256, each equal to the one recorded
        with it (RegistryError naming the file otherwise: the registry copy was modified)."""
        recorded = self.info.get("files_sha256") or {}
        out = {}
        for name in names:
            path = self.path / name
            if not path.is_file():
                continue
            actual = file_sha256(path)
            if recorded.get(name) and recorded[name] != actual:
                raise RegistryError(
                    f"{path}: sha256 {actual[:12]} differs from the {recorded[name][:12]} recorded with "
                    f"{self.name}; the registry copy was modified: restore it{hint}"
                )
            out[name] = (path, actual)
        return out


def check_names(recipe: str, board: str) -> None:
    """Refuse a recipe or board name outside the recipe's and the inventory's own rules (they name
    folders and rows, never used raw)."""
    if not isinstance(recipe, str) or not RECIPE_NAME_RE.match(recipe):
        raise RegistryError(f"recipe name {recipe!r}: expected 1-64 chars of [a-z0-9_-]")
    try:
        valid_board_name(board)
    except BoardError as exc:
        raise RegistryError(str(exc)) from exc


def candidate_files(model: Path, manifest: Path | None, extras: dict[str, Path] | None) -> dict[str, Path]:
    """A candidate's files under their names in a version: the model, the manifest, the side files."""
    files = {"model.onnx": Path(model)}
    if manifest is not None:
        files["manifest.json"] = Path(manifest)
    files.update({name: Path(p) for name, p in (extras or {}).items()})
    return files


def version_info(recipe: str, board: str, decision: Decision, hashes: dict[str, str],
                 info: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """What ``info.json`` records of a candidate; ``hashes`` are its files' sha256 but the JSON ones."""
    return {
        **(info or {}),
        "recipe": recipe,
        "board": board,
        "promoted": decision.promote,
        "reason": decision.reason,
        "decision": asdict(decision),
        "recorded_at": time.time(),
        "model_sha256": hashes["model.onnx"],
        "files_sha256": hashes,
    }


class ModelRegistry(ABC):
    """Numbered versions per recipe+board, every candidate recorded, ``current`` moved only by a
    promotion or a rollback (see :mod:`tasks.judge.registry` for the rule and the local layout)."""

    @abstractmethod
    def recipes(self, board: str) -> list[str]:
        """The recipes with a version recorded for ``board``, sorted (the fleet overview's rows)."""

    @abstractmethod
    def versions(self, recipe: str, board: str) -> list[Version]:
        """Every recorded version, oldest first."""

    @abstractmethod
    def version(self, recipe: str, board: str, name: str) -> Version:
        """The recorded version ``name``; RegistryError when there is no such version."""

    @abstractmethod
    def current(self, recipe: str, board: str) -> Version | None:
        """The version in service, or None before the first promotion."""

    @abstractmethod
    def record(self, recipe: str, board: str, model: Path, metrics: dict[str, Any], decision: Decision, *,
               info: dict[str, Any] | None = None, manifest: Path | None = None,
               extras: dict[str, Path] | None = None) -> Version:  # fmt: skip
        """Store a candidate as the next version; move ``current`` to it only if promoted.

        ``extras`` are files the model needs beside it, stored under their given names (a
        detector's ``priors.npy``, which its board application decodes boxes with)."""

    @abstractmethod
    def history(self, recipe: str, board: str) -> list[dict[str, Any]]:
        """Every change of ``current``, oldest first: {version, action, at}."""

    @abstractmethod
    def rollback(self, recipe: str, board: str) -> Version:
        """Put the previous version back in service; RegistryError when there is none."""

    def previous(self, recipe: str, board: str) -> Version | None:
        """The version that was in service before the current one (what a rollback restores)."""
        stack = self._stack(recipe, board)
        return self.version(recipe, board, stack[-2]) if len(stack) > 1 else None

    def rollback_target(self, recipe: str, board: str) -> tuple[Version, Version]:
        """(current, previous) for a rollback; RegistryError saying why there is nothing to roll back to."""
        current, previous = self.current(recipe, board), self.previous(recipe, board)
        if current is None or previous is None:
            raise nothing_to_roll_back(recipe, board, current and current.name)
        return current, previous

    def _stack(self, recipe: str, board: str) -> list[str]:
        """The versions in service over time, a rollback popping the one it replaced."""
        return service_stack(self.history(recipe, board))


def nothing_to_roll_back(recipe: str, board: str, current: str | None) -> RegistryError:
    """The refusal of a rollback with no version in service, or with only the first one."""
    why = "no version in service" if current is None else f"{current} is the first promoted"
    return RegistryError(f"{recipe} on {board}: nothing to roll back to ({why})")


def service_stack(history: list[dict[str, Any]]) -> list[str]:
    """The versions in service over ``history`` (changes of ``current``), a rollback popping the one it replaced."""
    stack: list[str] = []
    for change in history:
        if str(change.get("action", "")).startswith("rollback") and stack:
            stack.pop()
        else:
            stack.append(change["version"])
    return stack
