"""A prepared folder is built whole or not at all: :func:`staged` gives a temporary sibling that
replaces the folder only when the block completes.

The sibling is ``.<name>.partial-<pid>-<random>`` beside the folder (same file system, so the final
rename is one ``rename``); an earlier folder is moved aside as ``.<name>.old-<pid>-<random>`` just
before, and removed after. What a killed process left (a sibling whose pid is no longer running)
is removed by the next build of the same folder. Everything prepare records (manifest.json,
validation.json, :class:`~tasks.prepare.Prepared`) names files relative to the folder or by the
final folder, so the renamed folder is self-consistent.

For tests only, :func:`hold` stops a build at a named point while its temporary folder exists, until
the test lets it go (``$ODL_TEST_HOLD``): a test that signals or kills a prepare "mid-build" then
does so at a known point, however loaded the machine is. Unset, it does nothing.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.errors import PipelineError

PREPARED_MARK = "manifest.json"  # a folder holding it was written by prepare: it may be replaced
HOLD_ENV = "ODL_TEST_HOLD"  # tests only: "<point>=<fifo>", see hold()


def _sibling(folder: Path, kind: str) -> Path:
    return folder.with_name(f".{folder.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale(folder: Path) -> list[Path]:
    """Remove the temporary siblings of ``folder`` that a killed build left (their pid is gone);
    return them."""
    pattern = re.compile(rf"^\.{re.escape(folder.name)}\.(partial|old)-(\d+)-[0-9a-f]+$")
    stale = []
    for path in folder.parent.glob(f".{folder.name}.*"):
        match = pattern.match(path.name)
        if match and int(match.group(2)) != os.getpid() and not _alive(int(match.group(2))):
            shutil.rmtree(path, ignore_errors=True)
            stale.append(path)
    return stale


def remove_tree(path: Path) -> None:
    """Remove ``path`` (a partial build) whatever happens meanwhile: a second Ctrl-C or stop signal
    during the removal does not leave it half removed (the first one is already unwinding)."""
    while True:
        try:
            shutil.rmtree(path, ignore_errors=True)
            return
        except KeyboardInterrupt:
            continue


def hold(point: str) -> None:
    """For tests only: when ``$ODL_TEST_HOLD`` is ``<point>=<fifo>`` (a FIFO the test made), wait
    here until the test has opened the FIFO for writing and closed it again. The test's open returns
    only once this one has, so the test knows the build is here; until it closes, every stop signal
    is handled here (the wait wakes twice a second, so a signal another thread took is handled too).
    Does nothing when the variable is unset or names another point."""
    name, _, fifo = os.environ.get(HOLD_ENV, "").partition("=")
    if name != point or not fifo:
        return
    fd = os.open(fifo, os.O_RDONLY)  # blocks until the test opens the FIFO for writing
    try:
        while not (select.select([fd], [], [], 0.5)[0] and not os.read(fd, 4096)):
            pass  # until the test closes its end (end of file)
    finally:
        os.close(fd)


def _name_folder(exc: BaseException, work: Path, folder: Path) -> None:
    """Say ``folder`` where a pipeline error's message names the temporary sibling (gone now)."""
    if isinstance(exc, PipelineError):
        exc.args = tuple(a.replace(str(work), str(folder)) if isinstance(a, str) else a for a in exc.args)


@contextmanager
def staged(folder: Path, *, own: bool = False) -> Iterator[Path]:
    """A temporary sibling of ``folder`` that replaces it only when the block completes; removed
    when the block raises (the error's message then names ``folder``, not the sibling). ``folder``
    may be new, empty or an earlier prepared folder; a folder holding anything else is refused
    before anything is written, unless it is prepare's ``own`` (a cache folder of
    ``$ODL_HOME/prepared``, whatever steps it holds)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PipelineError(f"--out {folder}: is a file; name a new or empty folder, or an earlier prepare's")
    if not own and folder.is_dir() and any(folder.iterdir()) and not (folder / PREPARED_MARK).is_file():
        raise PipelineError(
            f"--out {folder}: holds files that are not a prepared recipe (no {PREPARED_MARK}); "
            "name a new or empty folder, or an earlier prepare's"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(folder)
    work = _sibling(folder, "partial")
    work.mkdir()  # the umask's mode, as the folder would have had
    try:
        yield work
    except BaseException as exc:  # an error, Ctrl-C, SIGTERM or SIGHUP (odl raises them alike)
        remove_tree(work)
        _name_folder(exc, work, folder)
        raise
    old = _sibling(folder, "old")
    if folder.exists():
        folder.rename(old)
    try:
        work.rename(folder)
    except BaseException:
        if old.exists():
            old.rename(folder)
        remove_tree(work)
        raise
    shutil.rmtree(old, ignore_errors=True)
