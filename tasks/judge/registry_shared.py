"""The shared model registry: versions and ``current`` in PostgreSQL, files as blobs by sha256.

Every host whose ``ODL_STORE_URL`` names the same database sees the same registry. Tables (created by
:mod:`tasks.store.connection`):

- ``odl_registry_entries`` (recipe, board, current_number): one row per recipe+board, the lock of
  its numbering and where ``current`` is kept;
- ``odl_registry_versions`` (recipe, board, number, promoted, decision, info, metrics, recorded_by):
  one row per candidate, primary key (recipe, board, number). info, metrics and decision are the JSON
  text the local backend writes to its files (text, not jsonb: a metric may be NaN, which JSON
  documents of PostgreSQL refuse);
- ``odl_registry_files`` (recipe, board, number, name, sha256 -> ``odl_blobs``): the version's files;
- ``odl_registry_history``: every change of ``current``, as the local ``history.jsonl``.

**Recording** a candidate: its files are put into the blob store first, each committed whole
(:class:`tasks.store.blobs.BlobStore`); then ONE transaction takes the entry's row lock
(``SELECT ... FOR UPDATE``), numbers the version ``max + 1``, inserts it and its files (a foreign key
refuses a file whose blob is not there) and, if promoted, moves ``current`` and appends to the
history. Two hosts recording the same recipe+board at once queue on that lock: no number is lost or
given twice (the primary key would refuse a duplicate), and ``current`` only ever names a version
whose row, files and blobs are all committed. A reader sees the state before or after, never between.

A version's files are fetched into this host's cache on first use (:mod:`tasks.judge.registry_cache`),
each verified against its sha256; the host that recorded it lays them there at once.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tasks.errors import RegistryError
from tasks.judge.decision import Decision
from tasks.judge.registry_base import (
    ModelRegistry,
    Version,
    candidate_files,
    check_names,
    nothing_to_roll_back,
    service_stack,
    version_info,
)
from tasks.judge.registry_cache import materialize
from tasks.store import BlobStore, PgBlobStore, Store

log = logging.getLogger(__name__)

_SELECT = (
    "SELECT v.number, v.info, v.metrics, (SELECT coalesce(json_object_agg(f.name, f.sha256), '{}') "
    "FROM odl_registry_files f WHERE (f.recipe, f.board, f.number) = (v.recipe, v.board, v.number)) "
    "FROM odl_registry_versions v "
)


def _name(number: int) -> str:
    return f"v{number:04d}"


def _number(name: str) -> int | None:
    return int(name[1:]) if isinstance(name, str) and name[:1] == "v" and name[1:].isdigit() else None


def _dumps(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str)


class SharedRegistry(ModelRegistry):
    """The registry on ``store``; its versions' files are cached under ``cache`` on this host."""

    def __init__(self, store: Store, cache: Path, blobs: BlobStore | None = None) -> None:
        self.store = store
        self.cache = Path(cache)
        self.blobs = blobs if blobs is not None else PgBlobStore(store)

    def __repr__(self) -> str:
        return f"SharedRegistry({self.store.cfg.url})"

    def _version(self, recipe: str, board: str, row: tuple) -> Version:
        number, info, metrics, files = row
        folder = self.cache / f"{recipe}-{board}" / _name(number)
        return Version(_name(number), folder, json.loads(info), json.loads(metrics), dict(files))

    def recipes(self, board: str) -> list[str]:
        with self.store.transaction() as conn:
            rows = conn.execute("SELECT recipe FROM odl_registry_entries WHERE board = %s ORDER BY recipe",
                                (board,)).fetchall()  # fmt: skip
        return [r[0] for r in rows]

    def versions(self, recipe: str, board: str) -> list[Version]:
        check_names(recipe, board)
        with self.store.transaction() as conn:
            rows = conn.execute(_SELECT + "WHERE v.recipe = %s AND v.board = %s ORDER BY v.number",
                                (recipe, board)).fetchall()  # fmt: skip
        return [self._version(recipe, board, r) for r in rows]

    def version(self, recipe: str, board: str, name: str) -> Version:
        check_names(recipe, board)
        number = _number(name)
        row = None
        if number is not None:
            with self.store.transaction() as conn:
                row = conn.execute(_SELECT + "WHERE v.recipe = %s AND v.board = %s AND v.number = %s",
                                   (recipe, board, number)).fetchone()  # fmt: skip
        if row is None:
            raise RegistryError(f"{recipe} on {board}: no version {name!r} in the registry")
        return self._version(recipe, board, row)

    def current(self, recipe: str, board: str) -> Version | None:
        check_names(recipe, board)
        with self.store.transaction() as conn:
            row = conn.execute(
                _SELECT + "JOIN odl_registry_entries e ON (e.recipe, e.board, e.current_number) = "
                "(v.recipe, v.board, v.number) WHERE v.recipe = %s AND v.board = %s",
                (recipe, board),
            ).fetchone()
        return self._version(recipe, board, row) if row else None

    def record(self, recipe: str, board: str, model: Path, metrics: dict[str, Any], decision: Decision, *,
               info: dict[str, Any] | None = None, manifest: Path | None = None,
               extras: dict[str, Path] | None = None) -> Version:  # fmt: skip
        check_names(recipe, board)
        files = candidate_files(model, manifest, extras)
        stored = {name: self.blobs.put(path) for name, path in files.items()}  # each committed, whole
        full = version_info(recipe, board, decision, {n: h for n, h in stored.items() if not n.endswith(".json")},
                            info)  # fmt: skip
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO odl_registry_entries (recipe, board) VALUES (%s, %s) "
                         "ON CONFLICT DO NOTHING", (recipe, board))  # fmt: skip
            conn.execute("SELECT 1 FROM odl_registry_entries WHERE recipe = %s AND board = %s FOR UPDATE",
                         (recipe, board))  # fmt: skip
            number = conn.execute("SELECT coalesce(max(number), 0) + 1 FROM odl_registry_versions "
                                  "WHERE recipe = %s AND board = %s", (recipe, board)).fetchone()[0]  # fmt: skip
            conn.execute(
                "INSERT INTO odl_registry_versions (recipe, board, number, promoted, decision, info, metrics, "
                "recorded_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (recipe, board, number, decision.promote, _dumps(asdict(decision)), _dumps(full),
                 _dumps(metrics), self.store.host),
            )  # fmt: skip
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO odl_registry_files (recipe, board, number, name, sha256) "
                                "VALUES (%s, %s, %s, %s, %s)",
                                [(recipe, board, number, n, h) for n, h in sorted(stored.items())])  # fmt: skip
            if decision.promote:
                self._move_current(conn, recipe, board, number, "promoted")
        version = Version(_name(number), self.cache / f"{recipe}-{board}" / _name(number),
                          json.loads(_dumps(full)), json.loads(_dumps(metrics)), stored)  # fmt: skip
        self._lay_in_cache(version, files)
        log.info("registry %s-%s (shared): recorded %s (%s): %s", recipe, board, version.name,
                 "promoted" if decision.promote else "rejected", decision.reason)  # fmt: skip
        return version

    def history(self, recipe: str, board: str) -> list[dict[str, Any]]:
        check_names(recipe, board)
        with self.store.transaction() as conn:
            return self._history(conn, recipe, board)

    def rollback(self, recipe: str, board: str) -> Version:
        check_names(recipe, board)
        with self.store.transaction() as conn:
            row = conn.execute("SELECT current_number FROM odl_registry_entries WHERE recipe = %s AND "
                               "board = %s FOR UPDATE", (recipe, board)).fetchone()  # fmt: skip
            current = row[0] if row else None
            stack = service_stack(self._history(conn, recipe, board))
            if current is None or len(stack) < 2:
                raise nothing_to_roll_back(recipe, board, current and _name(current))
            target = _number(stack[-2])
            self._move_current(conn, recipe, board, target, f"rollback from {_name(current)}")
        log.info("registry %s-%s (shared): rolled back %s -> %s", recipe, board, _name(current), stack[-2])
        return self.version(recipe, board, stack[-2])

    @staticmethod
    def _history(conn, recipe: str, board: str) -> list[dict[str, Any]]:
        rows = conn.execute("SELECT number, action, at FROM odl_registry_history WHERE recipe = %s AND "
                            "board = %s ORDER BY id", (recipe, board)).fetchall()  # fmt: skip
        return [{"version": _name(n), "action": action, "at": at} for n, action, at in rows]

    @staticmethod
    def _move_current(conn, recipe: str, board: str, number: int, action: str) -> None:
        conn.execute("UPDATE odl_registry_entries SET current_number = %s WHERE recipe = %s AND board = %s",
                     (number, recipe, board))  # fmt: skip
        conn.execute("INSERT INTO odl_registry_history (recipe, board, number, action, at) "
                     "VALUES (%s, %s, %s, %s, %s)", (recipe, board, number, action, time.time()))  # fmt: skip

    @staticmethod
    def _lay_in_cache(version: Version, files: dict[str, Path]) -> None:
        """This host has the files it just recorded: copy them into its cache, then verify them there
        (a file changed since it was stored is fetched from the store instead)."""
        version.folder.mkdir(parents=True, exist_ok=True)
        for name, src in files.items():
            tmp = version.folder / f".{name}.tmp"
            shutil.copy2(src, tmp)
            tmp.replace(version.folder / name)
        materialize(version.folder, version.files or {}, version.info, version.metrics)
