"""A host catching up with the shared store before it takes work (issue 45): ``python -m
tasks.hosts.catchup``, run in the host's own environment (its ``ODL_HOME``, its store URL) by ``odl
hosts up`` before each worker it starts (a new host, or one whose processes died: SIGKILL, a reboot)
and by ``odl hosts sync``; a real deployment runs the same before its worker (e.g. a systemd
``ExecStartPre``).

Nothing a host keeps is authoritative: its inventory copy, its registry cache and its prepared
folders are copies of the store's, each read or fetched whole and checked by hash at use. Catching
up does ahead of time what the first use would do, and removes what a killed process left:

- the inventory and the boards' pinned host keys are pulled from the store;
- the current version of every recipe on every board and group of the inventory is fetched into
  the registry cache (each file verified against its sha256, the folder marked complete last), so
  the host serves or compares against it without a fetch in the middle of a run;
- leftovers of a process killed mid-write are removed: a blob fetch's or a cache write's temporary
  files in the registry cache, a prepared folder's staging siblings whose process is gone.

Without ``ODL_STORE_URL`` only the leftovers are removed. It prints one line, a JSON summary.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tasks.board.inventory import load_groups, load_inventory
from tasks.errors import PipelineError
from tasks.judge.registry_cache import COMPLETE, cache_root
from tasks.judge.registry_open import open_registry
from tasks.paths import PROJECT_ROOT, odl_home
from tasks.prepare.staging import remove_stale
from tasks.store import store_config

log = logging.getLogger(__name__)
SIBLING = re.compile(r"^\.(?P<name>.+)\.(partial|old)-\d+-[0-9a-f]+$")


def leftovers(home: Path) -> list[Path]:
    """Remove what a killed writer left in ``home``'s registry cache and prepared folders; them."""
    removed = []
    for path in sorted((home / "registry-cache").rglob(".*")):  # temporary files: .<name>.<suffix>
        if path.is_file() and path.name != COMPLETE:
            path.unlink(missing_ok=True)
            removed.append(path)
    prepared = home / "prepared"
    names = (
        {m["name"] for p in prepared.glob(".*") if (m := SIBLING.match(p.name))} if prepared.is_dir() else ()
    )
    for name in sorted(names):
        removed += remove_stale(prepared / name)  # only those whose process is gone
    return removed


def catch_up(home: Path | None = None) -> dict[str, Any]:
    """Bring this host's copies up to date with the store (see the module docstring); a summary."""
    home = Path(home) if home is not None else odl_home()
    removed = leftovers(home)
    cfg = store_config()
    summary: dict[str, Any] = {"home": str(home), "store": cfg.url if cfg else None,
                               "removed": [str(p.relative_to(home)) for p in removed], "fetched": []}  # fmt: skip
    if cfg is None:
        return summary
    boards = load_inventory()  # pulls the inventory and the pinned keys from the store
    reg = open_registry(home)
    for name in sorted(set(boards) | set(load_groups())):
        for recipe in reg.recipes(name):
            current = reg.current(recipe, name)
            if current is not None and not (current.folder / COMPLETE).is_file():
                current.path  # noqa: B018 - fetched and verified here, ahead of its first use
                summary["fetched"].append(f"{recipe}/{name} {current.name}")
    summary["boards"] = len(boards)
    summary["cache"] = str(cache_root(cfg, home).relative_to(home))
    return summary


def as_host(prefix: list[str], env: dict[str, str], name: str) -> dict[str, Any] | None:
    """Catch host ``name`` up as itself (``prefix``: ``ip netns exec`` its namespace; ``env``: its
    worker's environment); the summary, or None when it could not (said in one line: its first use
    of each thing fetches it then)."""
    argv = [*prefix, sys.executable, "-m", "tasks.hosts.catchup"]
    run_env = {**env, "PYTHONPATH": str(PROJECT_ROOT)}
    try:
        done = subprocess.run(
            argv, env=run_env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired:
        log.warning("odl hosts: %s: catching up with the store took over 900 s; left to its first use", name)
        return None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        log.warning("odl hosts: %s could not catch up with the store (%s); left to its first use", name, why)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    try:
        print(json.dumps(catch_up(), sort_keys=True))
    except PipelineError as exc:
        print(f"catch-up: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
