"""``python3 -m device_agent [--root ROOT] info|blobs|put-blob|validate|run|start|status|cancel|
jobs|dataset|install-model|models|add-file|enrol|pull``: ``jobs``, ``install-model``, ``models`` and
``add-file`` are in :mod:`device_agent.board_cmds`; ``enrol`` and ``pull`` (pull mode: the board
dials the host) in :mod:`device_agent.pull.commands`; ``validate``, ``run`` and ``dataset``, which
read data and so load numpy, in :mod:`device_agent.data_cmds`, imported only to run one of them.

Stdout carries JSON lines only; human logs go to stderr and ``JOBDIR/agent.log``. The process
exit status is a :class:`~device_agent.protocol.ExitCode` (see README.md for the table).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from device_agent import board_cmds
from device_agent.data.blobstore import list_blobs, put_blob
from device_agent.errors import AgentError
from device_agent.job.jobdir import JobDir, open_jobdir
from device_agent.job.jobstate import job_status
from device_agent.job.launch import cancel_job, start_job
from device_agent.job.supervise import cmd_supervise
from device_agent.output import emit
from device_agent.protocol import EXIT_HELP, ExitCode
from device_agent.pull import commands as pull_cmds
from device_agent.sysinfo import board_info

log = logging.getLogger("device_agent")


def default_root() -> Path:
    """``$ODL_ROOT``, else ``~/odl``."""
    return Path(os.environ.get("ODL_ROOT") or Path.home() / "odl").expanduser()


def _job(args: argparse.Namespace) -> JobDir:
    return open_jobdir(args.jobdir, args.root)


def cmd_info(args: argparse.Namespace) -> int:
    """Print the board's versions, training API status, RAM, disk and machine. Exit 0 when
    onnxruntime imports, with its training API or not (the autograd runtime needs none; the host
    judges a job's runtime from ``training_api``), ENVIRONMENT when it does not."""
    info = board_info(args.root)
    emit(info.to_dict())
    return ExitCode.ENVIRONMENT if info.ort_version.startswith("missing") else ExitCode.OK


def cmd_blobs(args: argparse.Namespace) -> int:
    """List ROOT/blobs (sha256 -> size) and its free bytes; remove uploads cut off 10 min ago."""
    emit(list_blobs(args.root).to_dict())
    return ExitCode.OK


def cmd_put_blob(args: argparse.Namespace) -> int:
    """Verify an upload's sha256 and rename it into ROOT/blobs/SHA256 (read-only)."""
    emit(put_blob(args.root, args.tmp, args.sha256).to_dict())
    return ExitCode.OK


def cmd_start(args: argparse.Namespace) -> int:
    """Start the job detached (``supervise`` running ``run``; new session, stdio redirected); returns at once."""
    emit(start_job(_job(args)))
    return ExitCode.OK


def cmd_status(args: argparse.Namespace) -> int:
    """Print the job's state as one JSON object."""
    emit(job_status(_job(args)))
    return ExitCode.OK


def cmd_cancel(args: argparse.Namespace) -> int:
    """Ask a running job to stop at the next step boundary (it saves a checkpoint)."""
    emit(cancel_job(_job(args)))
    return ExitCode.OK


COMMANDS = {"info": cmd_info, "blobs": cmd_blobs, "put-blob": cmd_put_blob, "start": cmd_start,
            "status": cmd_status, "cancel": cmd_cancel, "supervise": cmd_supervise,
            **board_cmds.COMMANDS, **pull_cmds.COMMANDS}  # fmt: skip
# The commands that read data (device_agent.data_cmds) and their help: the first line of each docstring.
DATA_COMMANDS = {
    "validate": "Check spec, blobs, RAM/disk, that the artifacts load and the data fit; no training step.",
    "run": "Train in the foreground (resuming if interrupted); prints the result as one JSON line.",
    "dataset": board_cmds.DATASET_HELP,
}


def command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs command ``name``.

    Those of :data:`DATA_COMMANDS` load numpy (and ``validate``/``run`` the trainer), so their
    module is imported only when one of them runs: ``status``, polled while a job trains, and the
    other light commands start without numpy or onnxruntime.
    """
    if name in DATA_COMMANDS:
        from device_agent import data_cmds  # lazy: numpy and the trainer, for validate/run/dataset only

        return data_cmds.COMMANDS[name]
    return COMMANDS[name]


def build_parser() -> argparse.ArgumentParser:
    """The agent's argument parser."""
    epilog = "exit codes:\n" + "\n".join(
        f"  {int(c):>2} {ExitCode(c).name:<18} {h}" for c, h in EXIT_HELP.items()
    )
    parser = argparse.ArgumentParser(prog="python3 -m device_agent", epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--root", type=Path, default=None, help="agent root (default $ODL_ROOT or ~/odl)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, training API, RAM and disk as one JSON object")
    sub.add_parser("blobs", help=(cmd_blobs.__doc__ or "").split("\n")[0])
    put = sub.add_parser("put-blob", help=(cmd_put_blob.__doc__ or "").split("\n")[0])
    put.add_argument("tmp", help="the upload: ROOT/blobs/.tmp-SHA256-HEX")
    put.add_argument("sha256", help="the hash it must have (its name in ROOT/blobs)")
    for name in ("validate", "run", "start", "status", "cancel", "supervise"):
        text = DATA_COMMANDS.get(name) or (COMMANDS[name].__doc__ or "").split("\n")[0]
        sub.add_parser(name, help=text).add_argument("jobdir")
    board_cmds.add_parsers(sub)
    pull_cmds.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    os.umask(0o027)  # nothing the agent writes is group- or world-writable
    args = build_parser().parse_args(argv)
    args.root = (args.root or default_root()).expanduser().resolve()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(command(args.command)(args))
    except AgentError as exc:
        log.error("%s", exc)
        job = {"job_id": Path(args.jobdir).name} if getattr(args, "jobdir", None) else {}
        emit({**job, **exc.to_dict()})
        return int(exc.code)
