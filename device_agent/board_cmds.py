"""Board-level agent commands: ``jobs`` (who trains now), ``dataset`` (a growing folder, hashed),
``install-model`` and ``models`` (the releases the board's application serves)."""

from __future__ import annotations

import argparse
from typing import Any

from device_agent.protocol import ExitCode


def _emit(obj: dict[str, Any]) -> None:
    from device_agent.cli import emit

    emit(obj)


def cmd_jobs(args: argparse.Namespace) -> int:
    """List the jobs on the board with their state, the one training now first."""
    from device_agent.cli import job_status
    from device_agent.jobdir import JobDir, lock_is_held, training_owner

    jobs_dir = args.root / "jobs"
    found = []
    for path in sorted(jobs_dir.iterdir()) if jobs_dir.is_dir() else []:
        if not path.is_dir() or path.is_symlink() or not (path / "job.json").is_file():
            continue
        job = JobDir(path, args.root)
        if args.running and not lock_is_held(job):
            continue
        status = job_status(job)
        found.append(
            {k: status.get(k) for k in ("job_id", "state", "pid", "step", "total_steps", "exit_code")}
        )
    found.sort(key=lambda j: j["state"] != "running")
    owner = training_owner(args.root)  # the last job to take the lock: None once it has ended
    training = owner if any(j["job_id"] == owner and j["state"] == "running" for j in found) else None
    _emit({"training": training, "jobs": found})
    return ExitCode.OK


def cmd_dataset(args: argparse.Namespace) -> int:
    """List a dataset folder's files with size, sha256 and samples (hashes cached by mtime)."""
    from device_agent.datasets import list_dataset

    _emit(list_dataset(args.root, args.path, args.format))
    return ExitCode.OK


def cmd_install_model(args: argparse.Namespace) -> int:
    """Install a model release from blobs and switch models/RECIPE/current to it atomically."""
    from device_agent.errors import AgentError
    from device_agent.models import install

    files = {}
    for item in args.files:
        name, sep, sha = item.partition("=")
        if not sep:
            raise AgentError(ExitCode.INVALID_ARGUMENT, f"file: expected NAME=SHA256 (got {item!r})")
        files[name] = sha
    _emit(install(args.root, args.recipe, args.version, files))
    return ExitCode.OK


def cmd_models(args: argparse.Namespace) -> int:
    """The releases of RECIPE in service (current) and before it (previous), hashes re-verified."""
    from device_agent.models import status

    _emit(status(args.root, args.recipe))
    return ExitCode.OK


COMMANDS = {
    "jobs": cmd_jobs,
    "dataset": cmd_dataset,
    "install-model": cmd_install_model,
    "models": cmd_models,
}


def add_parsers(sub: Any) -> None:
    """Add these commands to the agent's sub-parsers."""

    def helped(name: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=(COMMANDS[name].__doc__ or "").split("\n")[0])

    helped("jobs").add_argument("--running", action="store_true", help="only the job training now")
    ds = helped("dataset")
    ds.add_argument("path", help="the folder, absolute or relative to the agent root")
    ds.add_argument("--format", default="npz-shards", choices=("npz-shards", "image-folder"))
    inst = helped("install-model")
    inst.add_argument("recipe")
    inst.add_argument("version", help="the registry version, e.g. v0003")
    inst.add_argument(
        "files", nargs="+", help="NAME=SHA256 of blobs: model.onnx, model.int8.onnx, priors.npy"
    )
    helped("models").add_argument("recipe")
