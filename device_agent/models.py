"""The models a board serves: ``ROOT/models/<recipe>/``, installed and rolled back atomically.

Layout (the contract with the board's inference application, see README.md)::

    models/<recipe>/releases/<version>-<sha12>/  model.onnx, model.int8.onnx, priors.npy (when the
                                          version has them) and release.json (version, sha256s)
    models/<recipe>/current               symlink -> releases/<version> in service
    models/<recipe>/previous              symlink -> releases/<version> served before it
    models/<recipe>/current.onnx          symlink -> current/model.onnx (fixed; follows current)
    models/<recipe>/current.int8.onnx     symlink -> current/model.int8.onnx
    models/<recipe>/current.json          symlink -> current/release.json
    models/<recipe>/on-change             optional executable run after each change, with the
                                          version as its argument

A release is built from verified blobs in a hidden staging folder, each file's sha256 checked
again after the copy, then renamed into ``releases/``; ``current`` is switched by renaming a new
symlink over it (atomic), so a reader sees the old release or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from device_agent.atomic import fsync_dir
from device_agent.errors import AgentError
from device_agent.protocol import NAME, ExitCode, SpecError, file_sha256, valid_blob_name

VERSION_RE = re.compile(r"^v\d{4,}$")
RELEASE_RE = re.compile(r"^v\d{4,}-[0-9a-f]{12}$")  # <version>-<model sha256[:12]>
RELEASE_FILES = ("model.onnx", "model.int8.onnx", "priors.npy")
KEEP_RELEASES = 3  # current, previous and one more; older releases are removed
HOOK_TIMEOUT_S = 60


def _bad(message: str) -> AgentError:
    return AgentError(ExitCode.INVALID_ARGUMENT, message)


def recipe_dir(root: Path, recipe: str) -> Path:
    """``ROOT/models/<recipe>`` after checking the name (:data:`~device_agent.names.NAME`)."""
    return root / "models" / NAME.check(recipe, "recipe", error=_bad)


def _release(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / "release.json").read_text())
    except (OSError, ValueError):
        return None


def _swap_link(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _stage(root: Path, folder: Path, version: str, files: dict[str, str]) -> Path:
    """``releases/<version>-<model sha12>`` holding the blobs ``files`` (name -> sha256), verified
    after the copy. Named by content too: a host whose registry started over installs its own v0001
    beside the old one, and a release is never rewritten in place (it may be the one in service)."""
    releases = folder / "releases"
    releases.mkdir(parents=True, exist_ok=True)
    final = releases / f"{version}-{files['model.onnx'][:12]}"
    have = _release(final)
    if have is not None and have.get("files") == files:
        return final  # already installed with the same bytes (a rollback to a kept release)
    staging = releases / f".staging-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name, sha in files.items():
        blob = root / "blobs" / sha
        if not blob.is_file():
            shutil.rmtree(staging, ignore_errors=True)
            raise AgentError(ExitCode.ARTIFACT_INVALID, f"{name}: blob {sha} is not on the board; upload it")
        shutil.copyfile(blob, staging / name)
        if file_sha256(staging / name) != sha:
            shutil.rmtree(staging, ignore_errors=True)
            raise AgentError(ExitCode.BLOB_MISMATCH, f"{name}: the copy of blob {sha} has another sha256")
    release = {"version": version, "files": files, "installed_at": time.time()}
    (staging / "release.json").write_text(json.dumps(release, indent=2, sort_keys=True))
    if final.exists():
        shutil.rmtree(final)
    os.rename(staging, final)
    return final


def install(root: Path, recipe: str, version: str, files: dict[str, str]) -> dict[str, Any]:
    """Install ``version`` (files: release name -> blob sha256) and put it in service."""
    folder = recipe_dir(root, recipe)
    if not VERSION_RE.match(version):
        raise _bad(f"version: expected v and 4+ digits (got {version!r})")
    if "model.onnx" not in files or not set(files) <= set(RELEASE_FILES):
        raise _bad(f"files: model.onnx and optionally model.int8.onnx, priors.npy (got {sorted(files)})")
    for name, sha in files.items():
        try:
            valid_blob_name(sha, name)
        except SpecError as exc:  # a command argument, not a job.json field
            raise _bad(str(exc)) from None
    release = _stage(root, folder, version, files)
    current = folder / "current"
    before = os.readlink(current) if current.is_symlink() else None
    target = f"releases/{release.name}"
    if before and before != target:
        _swap_link(folder / "previous", before)
    _swap_link(current, target)
    for name, link in (("model.onnx", "current.onnx"), ("model.int8.onnx", "current.int8.onnx"),
                       ("release.json", "current.json")):  # fmt: skip
        if not (folder / link).is_symlink():
            _swap_link(folder / link, f"current/{name}")
    fsync_dir(folder)
    _prune(folder)
    hook = _run_hook(folder, version)
    return {**status(root, recipe), "changed": before != target, "hook": hook}


def _prune(folder: Path) -> None:
    keep = {
        os.path.basename(os.readlink(folder / n))
        for n in ("current", "previous")
        if (folder / n).is_symlink()
    }
    releases = sorted(
        (p for p in (folder / "releases").iterdir() if RELEASE_RE.match(p.name)),
        key=lambda p: (_release(p) or {}).get("installed_at", 0),
    )
    for old in releases[: max(0, len(releases) - KEEP_RELEASES)]:
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)


def _run_hook(folder: Path, version: str) -> dict[str, Any] | None:
    hook = folder / "on-change"
    if not (hook.is_file() and os.access(hook, os.X_OK)):
        return None
    try:
        res = subprocess.run([str(hook), version], cwd=folder, capture_output=True, text=True,
                             timeout=HOOK_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"exit_code": None, "error": str(exc)}
    return {"exit_code": res.returncode, "error": res.stderr[-500:]}


def status(root: Path, recipe: str) -> dict[str, Any]:
    """The releases in service and before it, with their files' sha256 as installed."""
    folder = recipe_dir(root, recipe)
    out: dict[str, Any] = {"recipe": recipe, "current": None, "previous": None}
    for key in ("current", "previous"):
        link = folder / key
        if link.is_symlink():
            rel = _release(link)
            if rel is not None:
                rel["verified"] = all(
                    (link / name).is_file() and file_sha256(link / name) == sha
                    for name, sha in rel.get("files", {}).items()
                )
            out[key] = rel
    return out
