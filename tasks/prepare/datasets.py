"""A recipe's data files on the host, generated when missing: ``[data].make`` names a callable
(``module:function``, resolved like a model's) that writes them for the folder of the train (else
test) file.

It runs once, under a file lock, even when several runs prepare at the same time, and never into
the data folder itself: it writes into a fresh hidden folder beside the data
(``.make-<pid>-<random>/``), and only what does not exist yet in the data folder is then moved in,
each file by an atomic no-replace link (a new folder by one rename), so a user's own files stay
byte-identical and a make killed at any point leaves no half-made file: the next run sees what is
missing and makes it again (and removes the dead run's hidden folder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import errno
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tasks.errors import DataError, PipelineError, RecipeError
from tasks.prepare.export.torch_model import load_ref
from tasks.prepare.export.user_code import user_code_error
from tasks.recipe.datafiles import recipe_files
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)

MAKE_PREFIX = ".make-"  # the hidden folder a make writes into: .make-<pid>-<random>
LOCK_NAME = ".make.lock"


@dataclasses.dataclass
class Merge:
    """What moving a make's output into the data folder did, by path relative to the folder."""

    added: list[str] = dataclasses.field(default_factory=list)  # moved in (a folder ends with "/")
    kept: list[str] = dataclasses.field(default_factory=list)  # existed already: left as it was


def make_dir(recipe: Recipe) -> Path:
    """The folder a ``[data].make`` callable writes for: the folder of the train (else test) file."""
    return (recipe.data.train or recipe.data.test).parent


def ensure_datasets(recipe: Recipe) -> None:
    """Run ``[data].make`` (once, under a file lock) when a file the recipe names is missing; move in
    only what does not exist yet. DataError (RecipeError for ``model.onnx``) in one line naming each
    field whose file is still missing, with the nearest existing name."""
    named, out_dir = recipe_files(recipe), make_dir(recipe)
    if not _missing(named):
        _tidy(out_dir)
        return
    if recipe.data.make is None:
        raise DataError(_missing_line(_missing(named), out_dir, [], "[data].make is not set"))
    out_dir.mkdir(parents=True, exist_ok=True)
    produced: list[str] = []
    with _locked(out_dir):
        remove_stale(out_dir)
        if _missing(named):
            produced = _make(recipe, out_dir)
    still = _missing(named)
    if "model.onnx" in still:
        onnx = still["model.onnx"]
        hint = _hint(onnx, out_dir, produced)
        raise RecipeError("model.onnx", f"an existing ONNX file (or one [data].make writes){hint}", str(onnx))
    if still:
        why = f"[data].make {recipe.data.make} did not write it"
        raise DataError(_missing_line(still, out_dir, produced, why))


def _missing(named: dict[str, Path]) -> dict[str, Path]:
    return {field: path for field, path in named.items() if not path.exists()}


@contextlib.contextmanager
def _locked(out_dir: Path) -> Iterator[None]:
    """Hold the data folder's make lock (an exclusive ``flock``, released when the process dies)."""
    with open(out_dir / LOCK_NAME, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _tidy(out_dir: Path) -> None:
    """Remove dead runs' make folders when there are any (a read-only data folder is never locked)."""
    if _stale(out_dir):
        with _locked(out_dir):
            remove_stale(out_dir)


def remove_stale(out_dir: Path) -> list[Path]:
    """Remove the ``.make-<pid>-*`` folders of runs that died (called under the make lock, so no
    make of this process is running in ``out_dir``); return them."""
    stale = _stale(out_dir)
    for path in stale:
        log.info("removing %s, left by a [data].make that did not finish", path)
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _stale(out_dir: Path) -> list[Path]:
    """The ``.make-<pid>-*`` folders in ``out_dir`` whose process is not running."""
    found = [(p, _owner(p)) for p in out_dir.glob(MAKE_PREFIX + "*") if p.is_dir()]
    return [p for p, pid in found if pid is not None and not _alive(pid)]


def _owner(folder: Path) -> int | None:
    """The pid in a ``.make-<pid>-<random>`` name (None when the name has none)."""
    pid = folder.name[len(MAKE_PREFIX) :].partition("-")[0]
    return int(pid) if pid.isdigit() else None


def _alive(pid: int) -> bool:
    """Whether another process with this pid runs (under the lock this one's folders are stale)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _make(recipe: Recipe, out_dir: Path) -> list[str]:
    """Run the make into a fresh hidden folder of ``out_dir``, move in what is new, log one line;
    return every path the make wrote (relative). The hidden folder is always removed."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{MAKE_PREFIX}{os.getpid()}-", dir=out_dir))
    try:
        log.info("generating data with %s for %s", recipe.data.make, out_dir)
        _run_make(recipe, tmp)
        produced = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
        merge = merge_new(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    added, kept = ", ".join(merge.added) or "nothing", ", ".join(merge.kept) or "none"
    log.info("[data].make %s into %s: added %s; kept existing: %s", recipe.data.make, out_dir, added, kept)
    return produced


def _run_make(recipe: Recipe, tmp: Path) -> None:
    """Call ``[data].make`` on ``tmp``; an exception its code raises is one DataError line naming the
    user's file and line (a PipelineError it raises stays as it is)."""
    make = load_ref(recipe.base_dir, recipe.data.make, "data.make")
    try:
        make(tmp)
    except PipelineError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        who, doing = f"[data].make {recipe.data.make}", "making the data"
        named = user_code_error(exc, recipe.base_dir, doing, who=who, error=DataError)
        first = (str(exc).strip().splitlines() or [""])[0]
        raise named or DataError(f"{who} raised {type(exc).__name__} {doing}: {first}") from exc


def merge_new(src: Path, dst: Path, merge: Merge | None = None, rel: str = "") -> Merge:
    """Move each file and folder of ``src`` into ``dst`` that does not exist there yet (a folder by
    one rename when ``dst`` has none of that name, else file by file); never replace anything."""
    merge = merge if merge is not None else Merge()
    for entry in sorted(src.iterdir()):
        target, name = dst / entry.name, rel + entry.name
        if entry.is_dir() and not entry.is_symlink():
            if _rename_new_folder(entry, target):
                merge.added.append(name + "/")
            elif target.is_dir():
                merge_new(entry, target, merge, name + "/")
            else:
                merge.kept.append(name)
        elif _link_new(entry, target):
            merge.added.append(name)
        else:
            merge.kept.append(name)
    return merge


def _rename_new_folder(src: Path, dst: Path) -> bool:
    """Rename the folder ``src`` to ``dst`` if nothing is there (an empty folder that appeared
    meanwhile may be replaced, a non-empty one never is); False when ``dst`` exists."""
    if os.path.lexists(dst):
        return False
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            return False
        raise
    return True


def _link_new(src: Path, dst: Path) -> bool:
    """Give the file ``src`` the name ``dst`` unless it exists (a hard link fails rather than
    replace); on a file system without hard links, a rename after checking. False when kept."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK) or os.path.lexists(dst):
            raise
        os.rename(src, dst)
    return True


def _missing_line(missing: dict[str, Path], out_dir: Path, produced: list[str], why: str) -> str:
    """One line naming each missing field, its path and the nearest existing name."""
    return "; ".join(
        f"recipe field '{field}': {path} does not exist and {why}{_hint(path, out_dir, produced)}"
        for field, path in missing.items()
    )


def _hint(path: Path, out_dir: Path, produced: list[str]) -> str:
    """`` (did you mean test.npz?)``: the nearest name among the existing files of ``path``'s folder
    and what the make wrote (relative to ``out_dir`` when ``path`` is inside it)."""
    folder = path.parent
    names = [p.name for p in folder.iterdir() if not p.name.startswith(".")] if folder.is_dir() else []
    if path.is_relative_to(out_dir):
        base = folder.relative_to(out_dir)
        names = sorted({str(base / n) for n in names} | set(produced))
        wanted = str(path.relative_to(out_dir))
    else:
        wanted = path.name
    near = difflib.get_close_matches(wanted, names, n=1, cutoff=0.6)
    if near:
        return f" (did you mean {near[0]}?)"
    return f" (no file of a similar name in {folder})" if names else f" ({folder} is empty or missing)"
