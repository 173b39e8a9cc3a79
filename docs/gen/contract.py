"""The host's exit codes and error classes (``tasks/exits.py``, ``tasks/errors.py``) and the board agent's
protocol (``device_agent/protocol.py``, its commands from ``device_agent/cli.py``'s parser)."""

from __future__ import annotations

import dataclasses
import inspect
import re

from device_agent import cli as agent_cli
from device_agent import protocol
from device_agent.pull import contract as pull_contract
from docs.gen.cli import _subcommands
from docs.gen.markdown import cell, code, table
from tasks.exits import EXIT_INFO, HOST_EXITS, error_tree, exit_table

OTHER_STATUSES = """Other statuses: 0 success; 1 an error outside this tree (a bug prints its traceback; `odl report`
finds no report); 2 a command-line usage error; 128 + the signal when stopped by Ctrl-C, SIGTERM
or SIGHUP (130, 143, 129: one line, every cleanup run, no `.partial` folder left)."""


def _agent_codes() -> str:
    rows = [
        [str(int(c)), code(c.name), cell(protocol.EXIT_HELP[c]), "no" if c in protocol.NEVER_RETRY else "yes"]
        for c in protocol.ExitCode
    ]
    return table(["code", "name", "meaning", "a job ending so runs again"], rows)


def exit_codes_page() -> str:
    """The host's table (the one ``tests/test_errors.py`` holds equal to ``HOST_EXITS``), then the agent's."""
    return "\n".join(
        [
            "# Exit codes",
            "",
            "`odl` exits with a code of its own for each kind of error (50-79; the board agent's codes "
            "are 0-49, so the two never collide). `tasks/exits.py` holds the enum and `HOST_EXITS`, the "
            "one table of each code's error class and help, which the classes and the retry policy of "
            "`tasks/errors.py`, its docstring and this table are rendered from (`python -m docs.gen` or "
            "`python -m tests.test_errors` rewrites it here; a test fails when it differs). What each "
            "class means and what to do: [Errors](errors.md).",
            "",
            exit_table(),
            "",
            OTHER_STATUSES,
            "",
            "## The board agent's exit codes",
            "",
            "A job that fails on the board ends `odl` with 64 (`TrainingFailed`), its agent code in "
            "the message. Codes marked *no* are never retried: running again cannot fix them.",
            "",
            _agent_codes(),
        ]
    )


def errors_page() -> str:
    """One section per error class: its code, parent, whether it is retried, and what to do."""
    out = [
        "# Errors",
        "",
        "Every error of the host is one line, `odl: error: <message>`, naming the field, file or board "
        "and what was expected; `-v` adds the traceback. The message's class decides the exit status. "
        "The classes form one tree (`tasks/errors.py`); catch at the level you care about:",
        "",
        "```text",
        error_tree(),
        "```",
        "",
        "A class marked *retryable* is tried again by the Prefect tasks, the blob upload and the event "
        "follower (`tasks.errors.should_retry`); every other one stops at once.",
    ]
    for info in HOST_EXITS:
        cause, _, todo = info.help.partition(": ")
        where = info.home or "tasks.errors"
        parent = f", a kind of `{info.parent}`" if info.parent else ", the root"
        out += [
            "",
            f"## `{info.error}`",
            "",
            f"Exit {int(info.code)} (`{info.code.name}`){parent}; `{where}`; "
            f"{'retried' if info.retryable else 'not retried'}.",
            "",
            f"- **What happened:** {cell(cause)}.",
            f"- **What to do:** {cell(todo)}.",
        ]
    assert set(EXIT_INFO) == {i.code for i in HOST_EXITS}
    return "\n".join(out)


def _wire_type(cls: type) -> list[str]:
    doc = cell((inspect.getdoc(cls) or "").split("\n\n")[0])
    rows = [[code(f.name), code(getattr(f.type, "__name__", f.type))] for f in dataclasses.fields(cls)]
    return ["", f"### `{cls.__name__}`", "", doc, "", table(["field", "type"], rows)]


def protocol_page() -> str:
    """The contract: versions, layout, commands, events, wire types and exit codes."""
    doc = inspect.getdoc(protocol) or ""
    layout = doc.split("Board layout under the agent root (e.g. ``~/odl``)::", 1)[1].split("\n\nJob files")[0]
    commands = [[code(name), cell(text)] for name, text, _ in _subcommands(agent_cli.build_parser())]
    out = [
        "# Board agent protocol",
        "",
        "The contract between host and board, read from `device_agent/protocol.py` (imported by the "
        "agent *and* the host, standard library only). The agent is `device_agent/`: stdlib, numpy "
        "and onnxruntime, no torch; the host installs it over SSH and talks to it through one JSON "
        "command per call. The rules a board application follows (appending data, reading the "
        "model in service) are in [the agent's README](../device_agent.md).",
        "",
        f"- protocol version: **{protocol.PROTOCOL_VERSION}** (every wire object carries it under "
        f"`{protocol.VERSION_KEY}`)",
        f"- agent version: **{protocol.AGENT_VERSION}**",
        f"- names (job ids, board, group, recipe, dataset and report names): `{protocol.NAME_PATTERN}`",
        f"- event types of `events.jsonl`: {', '.join(code(t) for t in protocol.EVENT_TYPES)}",
        "",
        "## Board layout under the agent root",
        "",
        "```text",
        inspect.cleandoc(layout),
        "```",
        "",
        "Job files refer to blobs by sha256 only; the agent resolves `blobs/<sha256>` itself.",
        "",
        "## Commands",
        "",
        "`python3 -m device_agent.cli COMMAND` on the board (the host runs them over SSH):",
        "",
        table(["command", "what it does"], commands),
        "",
        "## Wire types",
        "",
        "Small frozen dataclasses with `to_dict`/`from_dict` that validate every field and name the bad "
        "one (`SpecError`).",
    ]
    for cls in (protocol.JobSpec, protocol.DataRef, protocol.DataFile, protocol.TrainParams, protocol.Event,
                protocol.JobResult, protocol.FileRef, protocol.BoardInfo, protocol.BlobListing):  # fmt: skip
        out += _wire_type(cls)
    out += ["", *_pull_section(), "", "## Exit codes", "", _agent_codes()]
    return "\n".join(out)


def _pull_section() -> list[str]:
    """Pull mode: the endpoint's routes and headers from ``device_agent/pull/contract.py``, the
    credentials and where each side keeps them."""
    doc = inspect.cleandoc(pull_contract.__doc__ or "")
    text = re.sub(r":(?:data|func|class|mod):`~?(?:[\w.]+\.)?(\w+)`", r"`\1`", doc.replace("``", "`"))
    return [
        "## Pull mode",
        "",
        f"Contract `{pull_contract.CONTRACT}`, routes under `{pull_contract.PREFIX}`, a request's time within "
        f"{pull_contract.MAX_SKEW_S} s of the host's, check-ins every {pull_contract.SLEEP_BOUNDS_S[0]:g} to "
        f"{pull_contract.SLEEP_BOUNDS_S[1]:g} s as the host says, transfers in pieces of "
        f"{pull_contract.CHUNK // 2**20} MiB. How a user sets a board up: [A board that can only dial out]"
        "(../tutorials/pull-board.md).",
        "",
        text,
        "",
        "**Credentials.** The board: `ROOT/pull/board.key` (its private key, 0600, made by `openssl` on the "
        "board, never sent), `ROOT/pull/endpoint.pem` (the pinned endpoint certificate), "
        "`ROOT/pull/config.json` (endpoint, pin, name; 0600). The host: `$ODL_HOME/pull/tls/` (the "
        "endpoint's certificate and its key, 0600, made once by `odl endpoint up` and kept: every board "
        "pinned it), `$ODL_HOME/pull/mailbox.sqlite3` (each board's public key and state; one-time codes "
        "stored as their sha256 only, valid once for a day; with `ODL_STORE_URL` the shared store's `odl_pull_*` "
        "tables instead, and the jobs' blobs and the boards' outputs the store's blobs, so a run on any host "
        "reaches the one endpoint), `$ODL_HOME/pull/endpoint.json` (url, listen "
        "address, pin). No secret is a flow parameter or a log line.",
        "",
        "| command | what it does |",
        "|---|---|",
        "| `odl endpoint up --listen HOST:PORT --url https://NAME:PORT` | start the endpoint (a service of the stack) |",
        '| `odl board enrol NAME` | the inventory entry (`transport = "pull"`) and a one-time code |',
        "| `odl board accept NAME --fingerprint sha256:...` | accept a board that enrolled without a code |",
        "| `odl board revoke NAME` | refuse the board's every request from the next one on |",
        "| `python3 -m device_agent --root ROOT enrol --endpoint URL --pin PIN --name NAME [--code CODE]` | on the board: key, pin, enrolment |",
        "| `python3 -m device_agent --root ROOT pull [--once]` | on the board: the service (`deploy/board/odl-pull.service`) |",
    ]
