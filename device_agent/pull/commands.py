"""Pull-mode commands of the agent: ``enrol`` (the board's key made, the endpoint's certificate
pinned, the board introduced to the host) and ``pull`` (the service that checks in with the host;
``deploy/board/odl-pull.service`` runs it under systemd). :mod:`device_agent.cli` registers them."""

from __future__ import annotations

import argparse
from typing import Any

from device_agent.errors import AgentError
from device_agent.output import emit
from device_agent.protocol import ExitCode
from device_agent.pull.client import ENDPOINT_PEM, Client
from device_agent.pull.config import PullConfig, check_endpoint, load_config
from device_agent.pull.identity import Identity, pull_dir
from device_agent.pull.service import enrol, require_config, serve


def cmd_enrol(args: argparse.Namespace) -> int:
    """Make the board's key if absent, pin the endpoint's certificate and enrol; prints the answer."""
    config = PullConfig(args.endpoint, args.pin, args.name)
    before = load_config(args.root)
    if before is None or (before.endpoint, before.pin) != (config.endpoint, config.pin):
        (pull_dir(args.root) / ENDPOINT_PEM).unlink(missing_ok=True)  # pinned again at first contact
    identity = Identity(args.root)
    made = identity.ensure()
    client = Client(args.root, config, identity=identity)
    try:
        answer = enrol(client, args.root, args.code)
    finally:
        client.close()
    emit({**answer.data, "name": config.name, "endpoint": config.url, "key_made": made})
    return ExitCode.OK


def cmd_pull(args: argparse.Namespace) -> int:
    """Run the pull-mode service: check in with the host, train what it hands out, send results back."""
    config = require_config(args.root)
    if args.endpoint is not None:
        check_endpoint(args.endpoint)
        if args.endpoint.rstrip("/") != config.url:
            raise AgentError(ExitCode.INVALID_ARGUMENT, f"endpoint: {args.endpoint!r} is not the one the board "
                                                        f"enrolled with ({config.url}): enrol again to change it", "endpoint")  # fmt: skip
    return serve(args.root, 1 if args.once else None)


COMMANDS = {"enrol": cmd_enrol, "pull": cmd_pull}


def add_parsers(sub: Any) -> None:
    """Add these commands to the agent's sub-parsers."""

    def helped(name: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=(COMMANDS[name].__doc__ or "").split("\n")[0])

    en = helped("enrol")
    en.add_argument("--endpoint", required=True, help="the host's pull endpoint, https://HOST[:PORT]")
    en.add_argument("--pin", required=True, help="its certificate's pin, sha256:HEX (from the operator)")
    en.add_argument("--name", required=True, help="this board's name at the host")
    en.add_argument(
        "--code", default=None, help="a one-time enrolment code (without one: pending until accepted)"
    )
    pull = helped("pull")
    pull.add_argument(
        "--endpoint", default=None, help="the enrolled endpoint (checked against ROOT/pull/config.json)"
    )
    pull.add_argument("--once", action="store_true", help="one check-in and its work, then exit")
