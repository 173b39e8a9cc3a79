"""The ``odl`` command line: every pipeline stage runs from here without a Prefect server.

Each subcommand lives in its own ``flows.cli.<area>`` module exposing ``register(subparsers)``;
handlers import heavy packages (torch, onnx, prefect) lazily so ``odl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from tasks.errors import PipelineError

COMMAND_MODULES = [
    "flows.cli.prepare",  # prepare / export / artifacts / validate
    "flows.cli.flow",  # stack / flow / evaluate / registry / report
    "flows.cli.board",  # board up / down / status / list / info
    "flows.cli.run",  # run: prepare -> deploy -> train -> retrieve without Prefect
    "flows.cli.nightly",  # rollout / rollback / models / data push|list
]


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="odl", description="On-device learning pipeline for STM32MP2 boards."
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, library messages and tracebacks"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _verbose_everywhere(sub)
    return parser


def _verbose_everywhere(sub: argparse._SubParsersAction) -> None:
    """Accept ``-v`` after the subcommand too (``odl flow RECIPE -v``)."""
    for parser in sub.choices.values():
        parser.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _verbose_everywhere(action)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``odl`` console script; returns the process exit status."""
    from flows.cli.terminal import error_line, setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except PipelineError as exc:
        if args.verbose:
            logging.getLogger("flows").exception("failed")
        print(f"odl: error: {error_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("odl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
