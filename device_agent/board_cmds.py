"""Board-level agent commands: ``jobs`` (who trains now), ``install-model`` and ``models`` (the
releases the board's application serves), ``add-file`` (append a file to a dataset folder); and the
arguments of ``dataset`` (a growing folder, hashed), which :mod:`device_agent.data_cmds` runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from device_agent.data.dataset_append import append_file
from device_agent.errors import AgentError
from device_agent.job.jobdir import JobDir, lock_is_held, training_owner
from device_agent.job.jobstate import job_status
from device_agent.models import install, status
from device_agent.output import emit
from device_agent.protocol import ExitCode

# The help of ``dataset``: the first line of data_cmds.cmd_dataset's docstring (that module loads numpy)
DATASET_HELP = "List a dataset folder's files with size, sha256 and samples (hashes cached by mtime)."


def cmd_jobs(args: argparse.Namespace) -> int:
    """List the jobs on the board with their state, the one training now first."""
    jobs_dir = args.root / "jobs"
    found = []
    for path in sorted(jobs_dir.iterdir()) if jobs_dir.is_dir() else []:
        if not path.is_dir() or path.is_symlink() or not (path / "job.json").is_file():
            continue
        job = JobDir(path, args.root)
        if args.running and not lock_is_held(job):
            continue
        state = job_status(job)
        found.append(
            {k: state.get(k) for k in ("job_id", "state", "pid", "step", "total_steps", "exit_code")}
        )
    found.sort(key=lambda j: j["state"] != "running")
    owner = training_owner(args.root)  # the last job to take the lock: None once it has ended
    training = owner if any(j["job_id"] == owner and j["state"] == "running" for j in found) else None
    emit({"training": training, "jobs": found})
    return ExitCode.OK


def cmd_install_model(args: argparse.Namespace) -> int:
    """Install a model release from blobs and switch models/RECIPE/current to it atomically."""
    files = {}
    for item in args.files:
        name, sep, sha = item.partition("=")
        if not sep:
            raise AgentError(ExitCode.INVALID_ARGUMENT, f"file: expected NAME=SHA256 (got {item!r})")
        files[name] = sha
    emit(install(args.root, args.recipe, args.version, files))
    return ExitCode.OK


def cmd_models(args: argparse.Namespace) -> int:
    """The releases of RECIPE in service (current) and before it (previous), hashes re-verified."""
    emit(status(args.root, args.recipe))
    return ExitCode.OK


def cmd_add_file(args: argparse.Namespace) -> int:
    """Append stdin as FOLDER/NAME of a dataset folder (hidden name, then linked; never rewritten)."""
    emit(append_file(args.root, args.folder, args.name, sys.stdin.buffer))
    return ExitCode.OK


COMMANDS = {
    "jobs": cmd_jobs,
    "install-model": cmd_install_model,
    "models": cmd_models,
    "add-file": cmd_add_file,
}


def add_parsers(sub: Any) -> None:
    """Add these commands to the agent's sub-parsers."""

    def helped(name: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=(COMMANDS[name].__doc__ or "").split("\n")[0])

    helped("jobs").add_argument("--running", action="store_true", help="only the job training now")
    ds = sub.add_parser("dataset", help=DATASET_HELP)
    ds.add_argument("path", help="the folder, absolute or relative to the agent root")
    ds.add_argument("--format", default="npz-shards", choices=("npz-shards", "image-folder"))
    inst = helped("install-model")
    inst.add_argument("recipe")
    inst.add_argument("version", help="the registry version, e.g. v0003")
    inst.add_argument(
        "files", nargs="+", help="NAME=SHA256 of blobs: model.onnx, model.int8.onnx, priors.npy"
    )
    helped("models").add_argument("recipe")
    add = helped("add-file")
    add.add_argument("folder", help="a relative path under the agent root, e.g. datasets/digits")
    add.add_argument("name", help="the file's name in the folder")
